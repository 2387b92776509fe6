#include "core/base64.hpp"

#include <cstdint>

namespace toyvm {

std::string base64_encode(std::string_view bytes) {
  static constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out.push_back(alphabet[(v >> shift) & 63]);
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out.push_back(alphabet[(v >> 18) & 63]);
    out.push_back(alphabet[(v >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? alphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

bool base64_decode(std::string_view text, std::string& out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() % 4 != 0) return false;
  out.clear();
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    int pad = (text[i + 3] == '=') + (text[i + 2] == '=');
    if (pad && i + 4 != text.size()) return false;
    int a = value(text[i]), b = value(text[i + 1]);
    int c = pad >= 2 ? 0 : value(text[i + 2]);
    int d = pad >= 1 ? 0 : value(text[i + 3]);
    if (a < 0 || b < 0 || c < 0 || d < 0) return false;
    // Canonical only: bits that padding drops must be zero, so each text has one meaning.
    if ((pad == 2 && (b & 0xf)) || (pad == 1 && (c & 0x3))) return false;
    uint32_t v = uint32_t(a) << 18 | uint32_t(b) << 12 | uint32_t(c) << 6 | uint32_t(d);
    out.push_back(char(v >> 16));
    if (pad < 2) out.push_back(char((v >> 8) & 0xff));
    if (pad < 1) out.push_back(char(v & 0xff));
  }
  return true;
}

}  // namespace toyvm
