#pragma once
// The metadata service's HTTP side: each guest, found by its source address, is answered with
// its own data only. Who the guests are is the caller's to say: the compute agent knows its
// own; `toyvm mdserver` follows every instance in etcd.

#include "core/async.hpp"
#include "core/config.hpp"
#include "model/metadata.hpp"
#include "model/rate_limit.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/network_v4.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toyvm {

class MetadataHttpServer {
 public:
  // The guest that has `ip` now, if exactly one has it; null otherwise.
  using Lookup = std::function<std::shared_ptr<const GuestView>(const std::string& ip)>;

  MetadataHttpServer(asio::io_context& io, const MdserverConfig& config, Lookup lookup);

  // Reads guest_networks; invalid_config when one is not A.B.C.D/N.
  result<void> configure();

  // ADDRESS:PORT ([ADDRESS]:PORT for IPv6) as an endpoint; nullopt when it is not one
  // (core/address.hpp reads it).
  static std::optional<asio::ip::tcp::endpoint> parse_listen(const std::string& address);
  // What to say when parse_listen refuses `address`, given as `setting`.
  static std::string bad_listen(std::string_view setting, const std::string& address);

  // Serves ADDRESS:PORT from now on. With a device, only connections that arrive on it
  // (SO_BINDTODEVICE): agents of one machine then serve their own bridges on one address.
  result<void> listen(const std::string& address, const std::string& device);

  // Closes every listening socket; connections being served finish.
  void stop_listening();

 private:
  awaitable<void> accept_loop(std::shared_ptr<asio::ip::tcp::acceptor> acceptor);
  awaitable<void> serve(asio::ip::tcp::socket socket);
  bool from_guest_network(const std::string& ip) const;

  asio::io_context& io_;
  const MdserverConfig& config_;
  Lookup lookup_;
  RateLimiter limiter_;
  std::vector<asio::ip::network_v4> guest_networks_;
  std::vector<std::shared_ptr<asio::ip::tcp::acceptor>> acceptors_;
  int connections_ = 0;
};

}  // namespace toyvm
