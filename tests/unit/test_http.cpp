#include "clients/http.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <chrono>
#include <optional>
#include <string>

using namespace toyvm;
using tcp = asio::ip::tcp;

namespace {

struct Exchange {
  std::optional<result<HttpResponse>> response;
  std::string request_head;  // what the server received, up to the blank line
};

// One request from an HttpClient at `url` to a server on `listen_address` that answers it with
// 200 "ok"; the URL's port is the server's. Returns nothing when the address cannot be bound
// (a host without IPv6).
std::optional<Exchange> exchange_with(const std::string& listen_address, const std::string& url_host) {
  asio::io_context io;
  error_code ec;
  tcp::acceptor acceptor(io);
  tcp::endpoint at(asio::ip::make_address(listen_address), 0);
  acceptor.open(at.protocol(), ec);
  if (!ec) acceptor.bind(at, ec);
  if (!ec) acceptor.listen(4, ec);
  if (ec) return std::nullopt;

  // The coroutines' lambdas are named: a coroutine reaches its captures through the lambda,
  // which must outlive it.
  Exchange exchange;
  auto serve = [&]() -> awaitable<void> {
    auto [accept_ec, socket] = co_await acceptor.async_accept(asio::as_tuple(use_awaitable));
    if (accept_ec) co_return;
    std::string head;
    auto [read_ec, n] = co_await asio::async_read_until(socket, asio::dynamic_buffer(head), "\r\n\r\n",
                                                        asio::as_tuple(use_awaitable));
    if (read_ec) co_return;
    exchange.request_head = head.substr(0, n);
    std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    co_await asio::async_write(socket, asio::buffer(answer), asio::as_tuple(use_awaitable));
  };
  asio::co_spawn(io, serve(), asio::detached);

  const std::string url = "http://" + url_host + ":" + std::to_string(acceptor.local_endpoint().port());
  HttpClient client(io.get_executor(), HttpClientOptions{url, std::chrono::milliseconds(5'000), {}, {}});
  auto ask = [&]() -> awaitable<void> {
    HttpRequest request;  // a named argument: GCC 12 destroys a temporary in co_await twice
    request.target = "/resource_providers";
    exchange.response = co_await client.request(std::move(request));
    io.stop();
  };
  asio::co_spawn(io, ask(), asio::detached);
  asio::steady_timer deadline(io, std::chrono::seconds(10));
  deadline.async_wait([&](auto) { io.stop(); });
  io.run();
  return exchange;
}

void require_answered(const std::optional<Exchange>& exchange, const std::string& host_header) {
  REQUIRE(exchange->response.has_value());
  REQUIRE(exchange->response->has_value());
  CHECK((*exchange->response)->status == 200);
  CHECK((*exchange->response)->body == "ok");
  CHECK(exchange->request_head.rfind("GET /resource_providers HTTP/1.1\r\n", 0) == 0);
  CHECK(exchange->request_head.find("Host: " + host_header + ":") != std::string::npos);
}

}  // namespace

TEST_CASE("the HTTP client reaches an IPv4 address, an IPv6 address and a name", "[http]") {
  SECTION("IPv4") {
    auto exchange = exchange_with("127.0.0.1", "127.0.0.1");
    REQUIRE(exchange);
    require_answered(exchange, "127.0.0.1");
  }
  SECTION("IPv6, in brackets in the URL and the Host header") {
    auto exchange = exchange_with("::1", "[::1]");
    if (!exchange) {
      WARN("this host has no IPv6 loopback");
      return;
    }
    require_answered(exchange, "[::1]");
  }
  SECTION("a name, resolved") {
    auto exchange = exchange_with("127.0.0.1", "localhost");
    REQUIRE(exchange);
    require_answered(exchange, "localhost");
  }
}

TEST_CASE("the HTTP client says so when nothing listens", "[http]") {
  asio::io_context io;
  // A port just bound and released: nothing listens there now.
  tcp::acceptor probe(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const auto port = probe.local_endpoint().port();
  probe.close();
  HttpClient client(io.get_executor(), HttpClientOptions{"http://127.0.0.1:" + std::to_string(port), {}, {}, {}});
  std::optional<result<HttpResponse>> response;
  auto ask = [&]() -> awaitable<void> {
    HttpRequest request;
    request.target = "/";
    response = co_await client.request(std::move(request));
  };
  asio::co_spawn(io, ask(), asio::detached);
  io.run();
  REQUIRE(response.has_value());
  REQUIRE_FALSE(response->has_value());
  CHECK(response->error() == asio::error::connection_refused);
}
