#pragma once
// Base64 (RFC 4648, with padding): user data in etcd values and in the metadata service.

#include <optional>
#include <string>
#include <string_view>

namespace toyvm {

std::string base64_encode(std::string_view bytes);
// Nothing for malformed or non-canonical input (each text has one meaning).
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace toyvm
