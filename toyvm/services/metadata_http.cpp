#include "services/metadata_http.hpp"

#include "core/address.hpp"
#include "core/metrics.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <sys/socket.h>

namespace toyvm {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

std::string client_address(const tcp::socket& socket) {
  error_code ec;
  auto endpoint = socket.remote_endpoint(ec);
  if (ec) return {};
  auto address = endpoint.address();
  if (address.is_v6() && address.to_v6().is_v4_mapped())
    return asio::ip::make_address_v4(asio::ip::v4_mapped, address.to_v6()).to_string();
  return address.to_string();
}

awaitable<void> reply_error(beast::tcp_stream& stream, http::status status) {
  http::response<http::string_body> response{status, 11};
  response.set(http::field::server, "toyvm-mdserver");
  response.keep_alive(false);
  response.body() = std::string(http::obsolete_reason(status)) + "\n";
  response.prepare_payload();
  co_await http::async_write(stream, response, no_throw);
}

}  // namespace

MetadataHttpServer::MetadataHttpServer(asio::io_context& io, const MdserverConfig& config, Lookup lookup)
    : io_(io), config_(config), lookup_(std::move(lookup)), limiter_(config.rate_limit, config.rate_burst) {}

result<void> MetadataHttpServer::configure() {
  for (const std::string& cidr : config_.guest_networks) {
    error_code ec;
    auto network = asio::ip::make_network_v4(cidr, ec);
    if (ec) return Error(errc::invalid_config, fmt::format("bad guest network '{}' (expected A.B.C.D/N)", cidr));
    guest_networks_.push_back(network);
  }
  return {};
}

std::optional<tcp::endpoint> MetadataHttpServer::parse_listen(const std::string& address) {
  return parse_listen_address(address);
}

std::string MetadataHttpServer::bad_listen(std::string_view setting, const std::string& address) {
  return fmt::format("bad {} '{}' (expected ADDRESS:PORT, [ADDRESS]:PORT for IPv6)", setting, address);
}

result<void> MetadataHttpServer::listen(const std::string& address, const std::string& device) {
  auto parsed = parse_listen(address);
  if (!parsed) return Error(errc::invalid_config, bad_listen("listen address", address));
  const tcp::endpoint endpoint = *parsed;
  error_code ec;
  auto acceptor = std::make_shared<tcp::acceptor>(io_);
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec && !device.empty() &&
      setsockopt(acceptor->native_handle(), SOL_SOCKET, SO_BINDTODEVICE, device.data(), socklen_t(device.size())) != 0)
    ec = error_code(errno, boost::system::system_category());
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return Error(ec, fmt::format("cannot listen on {}{}: {}", address, device.empty() ? "" : " (" + device + ")",
                                 ec.message()));
  spdlog::info("serving metadata on {}{}", address, device.empty() ? "" : " (" + device + ")");
  acceptors_.push_back(acceptor);
  asio::co_spawn(io_, accept_loop(std::move(acceptor)), asio::detached);
  return {};
}

void MetadataHttpServer::stop_listening() {
  for (auto& acceptor : acceptors_) {
    error_code ignored;
    acceptor->close(ignored);
  }
  acceptors_.clear();
}

awaitable<void> MetadataHttpServer::accept_loop(std::shared_ptr<tcp::acceptor> acceptor) {
  while (true) {
    auto [ec, socket] = co_await acceptor->async_accept(no_throw);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor->is_open()) co_return;
      // Out of descriptors and the like: pause rather than spin.
      asio::steady_timer timer(io_, 10ms);
      co_await timer.async_wait(use_awaitable);
      continue;
    }
    if (connections_ >= config_.max_connections) continue;  // closes it
    asio::co_spawn(io_, serve(std::move(socket)), asio::detached);
  }
}

awaitable<void> MetadataHttpServer::serve(tcp::socket socket) {
  ++connections_;
  struct Count {
    int& n;
    ~Count() { --n; }
  } count{connections_};
  const std::string ip = client_address(socket);
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  const auto idle = config_.idle_timeout;
  while (true) {
    stream.expires_after(idle);  // also bounds a client that sends a request slowly
    http::request_parser<http::empty_body> parser;
    parser.header_limit(8 * 1024);
    auto [read_ec, read] = co_await http::async_read(stream, buffer, parser, no_throw);
    if (read_ec) {
      if (read_ec == http::error::header_limit) co_await reply_error(stream, http::status::request_header_fields_too_large);
      else if (read_ec == http::error::unexpected_body || read_ec == http::error::body_limit)
        co_await reply_error(stream, http::status::payload_too_large);
      else if (read_ec != http::error::end_of_stream && read_ec != beast::error::timeout &&
               read_ec != asio::error::connection_reset && read_ec != asio::error::eof)
        co_await reply_error(stream, http::status::bad_request);
      break;
    }
    const auto& request = parser.get();
    const auto started = std::chrono::steady_clock::now();
    MetadataResponse answer;
    if (!from_guest_network(ip)) {
      answer = {403, "text/plain", "Forbidden\n"};
    } else if (!limiter_.allow(ip, started)) {
      answer = {429, "text/plain", "Too Many Requests\n"};
      metrics::count("toyvm_mdserver_rate_limited_total");
    } else {
      std::shared_ptr<const GuestView> guest = lookup_(ip);
      answer = route_metadata(request.method_string(), request.target(), guest.get());
    }
    http::response<http::string_body> response{static_cast<http::status>(answer.status), request.version()};
    response.set(http::field::server, "toyvm-mdserver");
    response.set(http::field::content_type, answer.content_type);
    response.keep_alive(request.keep_alive());
    response.body() = std::move(answer.body);
    response.prepare_payload();
    if (request.method() == http::verb::head) response.body().clear();  // length stays
    auto [write_ec, written] = co_await http::async_write(stream, response, no_throw);
    metrics::count("toyvm_mdserver_requests_total", {{"code", std::to_string(answer.status)}});
    metrics::observe("toyvm_mdserver_request_seconds",
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    if (write_ec || !response.keep_alive()) break;
  }
  error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

bool MetadataHttpServer::from_guest_network(const std::string& ip) const {
  if (guest_networks_.empty()) return true;
  error_code ec;
  auto address = asio::ip::make_address_v4(ip, ec);
  if (ec) return false;
  for (const auto& network : guest_networks_) {
    if ((address.to_uint() & network.netmask().to_uint()) == network.network().to_uint()) return true;
  }
  return false;
}

}  // namespace toyvm
