#pragma once
// Hosts and ports as URLs and listen addresses write them, all read by Boost.URL's grammar
// (RFC 3986): an IPv6 address goes in brackets wherever a port may follow it.

#include <boost/asio/ip/tcp.hpp>

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

// "[scheme://]host[:port][/path]" with an IPv6 host in brackets (or bare, then without a
// port); `default_port` when none is written. What cannot be read comes back whole as the
// host, for the resolver to refuse.
HostPort split_host_port(std::string_view endpoint, std::string_view default_port);

// A port written in full, 1-65535; nothing for anything else ("", "0", "080", "80x", "65536").
std::optional<uint16_t> parse_port(std::string_view text);

// "ADDRESS:PORT", "[IPV6-ADDRESS]:PORT": an address to listen on, both parts required and
// the address no name. ::ffff:a.b.c.d is the IPv4 address a.b.c.d, compared and bound as such.
std::optional<boost::asio::ip::tcp::endpoint> parse_listen_address(std::string_view text);

// An http:// or https:// URL that names a host: how endpoints are configured.
bool is_http_url(std::string_view text);

}  // namespace toyvm
