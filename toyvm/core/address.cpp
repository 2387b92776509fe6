#include "core/address.hpp"

#include <charconv>

#include <arpa/inet.h>

namespace toyvm {

std::string bare_host(std::string_view host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::string(host);
}

bool is_ip_address(std::string_view host) {
  const std::string text(host);
  in6_addr any{};
  return inet_pton(AF_INET, text.c_str(), &any) == 1 || inet_pton(AF_INET6, text.c_str(), &any) == 1;
}

HostPort split_host_port(std::string_view text, std::string_view default_port) {
  if (auto pos = text.find("://"); pos != std::string_view::npos) text.remove_prefix(pos + 3);
  while (!text.empty() && text.back() == '/') text.remove_suffix(1);
  size_t colon = std::string_view::npos;  // a bare IPv6 address has no port
  if (text.starts_with('['))
    colon = text.find(':', text.find(']'));
  else if (text.find(':') == text.rfind(':'))
    colon = text.find(':');
  if (colon == std::string_view::npos || colon + 1 == text.size())
    return {bare_host(text.substr(0, colon)), std::string(default_port)};
  return {bare_host(text.substr(0, colon)), std::string(text.substr(colon + 1))};
}

std::optional<uint16_t> parse_port(std::string_view text) {
  uint16_t port = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (error != std::errc() || end != text.data() + text.size() || port == 0) return std::nullopt;
  return port;
}

}  // namespace toyvm
