#include "core/address.hpp"

#include <boost/url/authority_view.hpp>
#include <boost/url/grammar/parse.hpp>
#include <boost/url/grammar/unsigned_rule.hpp>
#include <boost/url/ipv4_address.hpp>
#include <boost/url/ipv6_address.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

namespace toyvm {

namespace urls = boost::urls;
namespace ip = boost::asio::ip;

std::string bare_host(std::string_view host) {
  auto authority = urls::parse_authority(host);
  if (authority && authority->host_type() == urls::host_type::ipv6 && !authority->has_port() &&
      !authority->has_userinfo())
    return std::string(authority->encoded_host_address());
  return std::string(host);
}

bool is_ip_address(std::string_view host) {
  return urls::parse_ipv4_address(host).has_value() || urls::parse_ipv6_address(host).has_value();
}

HostPort split_host_port(std::string_view text, std::string_view default_port) {
  // A bare IPv6 address has no port, and nothing to split.
  if (is_ip_address(text)) return {std::string(text), std::string(default_port)};
  // "name:port" alone reads as a URI of scheme "name": only one with an authority counts.
  auto url = urls::parse_uri(text);
  const std::string relative = "//" + std::string(text);
  if (!url || !url->has_authority()) url = urls::parse_uri_reference(relative);
  if (!url || !url->has_authority()) return {std::string(text), std::string(default_port)};
  return {std::string(url->encoded_host_address()),
          std::string(url->port().empty() ? default_port : std::string_view(url->port()))};
}

std::optional<uint16_t> parse_port(std::string_view text) {
  auto port = urls::grammar::parse(text, urls::grammar::unsigned_rule<uint16_t>{});
  if (!port || *port == 0) return std::nullopt;
  return *port;
}

std::optional<ip::tcp::endpoint> parse_listen_address(std::string_view text) {
  auto authority = urls::parse_authority(text);
  if (!authority || authority->has_userinfo() || !authority->has_port()) return std::nullopt;
  auto port = parse_port(authority->port());
  if (!port) return std::nullopt;
  switch (authority->host_type()) {
    case urls::host_type::ipv4:
      return ip::tcp::endpoint(ip::address_v4(authority->host_ipv4_address().to_bytes()), *port);
    case urls::host_type::ipv6: {
      const ip::address_v6 v6(authority->host_ipv6_address().to_bytes());
      if (v6.is_v4_mapped()) return ip::tcp::endpoint(ip::make_address_v4(ip::v4_mapped, v6), *port);
      return ip::tcp::endpoint(v6, *port);
    }
    default:
      return std::nullopt;  // a name, or an IPvFuture
  }
}

bool is_http_url(std::string_view text) {
  auto url = urls::parse_uri(text);
  return url && (url->scheme() == "http" || url->scheme() == "https") && url->has_authority() &&
         !url->encoded_host().empty();
}

}  // namespace toyvm
