#pragma once
// Hosts and ports as URLs and listen addresses write them.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace toyvm {

// The host without the brackets a URL puts around an IPv6 address ("[::1]" -> "::1").
std::string bare_host(std::string_view host);

// Whether the host is an IPv4 or IPv6 address (without brackets), not a name.
bool is_ip_address(std::string_view host);

struct HostPort {
  std::string host;  // without brackets
  std::string port;
};

// "[scheme://]host[:port][/]" with an IPv6 host in brackets (or bare, then without a port).
HostPort split_host_port(std::string_view endpoint, std::string_view default_port);

// A port written in full, 1-65535; nothing for anything else ("", "0", "80x", "65536").
std::optional<uint16_t> parse_port(std::string_view text);

}  // namespace toyvm
