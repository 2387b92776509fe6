#include "core/base64.hpp"

#include <openssl/evp.h>

namespace toyvm {

std::string base64_encode(std::string_view bytes) {
  std::string out((bytes.size() + 2) / 3 * 4 + 1, '\0');  // and the NUL it writes
  int written = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), int(bytes.size()));
  out.resize(size_t(written));
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out(text.size() / 4 * 3, '\0');
  int written = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()), int(text.size()));
  if (written < 0) return std::nullopt;
  // OpenSSL decodes padding as zero bytes and forgives spaces and bits padding drops: the text
  // is taken only when it is what the bytes encode to, so each text has one meaning.
  size_t padding = text.ends_with("==") ? 2 : text.ends_with("=") ? 1 : 0;
  if (size_t(written) < padding) return std::nullopt;
  out.resize(size_t(written) - padding);
  if (base64_encode(out) != text) return std::nullopt;
  return out;
}

}  // namespace toyvm
