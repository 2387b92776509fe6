#include "services/metrics_http.hpp"

#include "core/metrics.hpp"
#include "services/metadata_http.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace toyvm {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// One request a connection: a scraper asks every so often, and nothing else talks to this.
awaitable<void> answer(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  stream.expires_after(std::chrono::seconds(10));
  beast::flat_buffer buffer;
  http::request_parser<http::empty_body> parser;
  parser.header_limit(8 * 1024);
  auto [read_ec, read] = co_await http::async_read(stream, buffer, parser, no_throw);
  if (read_ec) co_return;
  const auto& request = parser.get();
  const bool scrape = request.method() == http::verb::get && request.target() == "/metrics";
  http::response<http::string_body> response{scrape ? http::status::ok : http::status::not_found, request.version()};
  response.set(http::field::content_type, scrape ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain");
  response.body() = scrape ? metrics::render() : "Not Found\n";
  response.keep_alive(false);
  response.prepare_payload();
  co_await http::async_write(stream, response, no_throw);
  error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

awaitable<void> accept_loop(std::shared_ptr<tcp::acceptor> acceptor) {
  auto executor = co_await asio::this_coro::executor;
  while (acceptor->is_open()) {
    auto [ec, socket] = co_await acceptor->async_accept(no_throw);
    if (ec) {
      asio::steady_timer pause(executor, std::chrono::milliseconds(10));  // out of descriptors and the like
      co_await pause.async_wait(no_throw);
      continue;
    }
    asio::co_spawn(executor, answer(std::move(socket)), asio::detached);
  }
}

}  // namespace

result<void> serve_metrics(asio::io_context& io, const std::string& address,
                           const std::vector<std::string>& guest_listens) {
  auto endpoint = MetadataHttpServer::parse_listen(address);
  if (!endpoint)
    return Error(errc::invalid_config, MetadataHttpServer::bad_listen("metrics_listen", address));
  const auto ip = endpoint->address();
  // Every address (0.0.0.0, ::) includes the metadata address.
  bool guests_reach =
      ip.is_unspecified() || (ip.is_v4() && ip.to_v4() == asio::ip::make_address_v4("169.254.169.254"));
  for (const std::string& listen : guest_listens) {
    auto guest = MetadataHttpServer::parse_listen(listen);
    if (guest && guest->address() == ip) guests_reach = true;
  }
  if (guests_reach)
    return Error(errc::invalid_config, fmt::format("metrics_listen {} is an address guests reach (the metadata "
                                                   "service's); choose another", address));
  auto acceptor = std::make_shared<tcp::acceptor>(io);
  error_code ec;
  acceptor->open(endpoint->protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor->bind(*endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Error(ec, fmt::format("cannot serve metrics on {}: {}", address, ec.message()));
  spdlog::info("serving metrics on http://{}/metrics", address);
  asio::co_spawn(io, accept_loop(std::move(acceptor)), asio::detached);
  return {};
}

}  // namespace toyvm
