#include "clients/http.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/url/parse.hpp>
#include <spdlog/spdlog.h>

#include <netinet/in.h>
#include <netinet/tcp.h>

namespace toyvm {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
constexpr auto no_throw = asio::as_tuple(use_awaitable);

struct HttpClient::Impl {
  asio::any_io_executor executor;
  HttpClientOptions options;
  std::string host;
  std::string port;
  std::string base_path;
  std::string host_header;
  tcp::resolver::results_type endpoints;  // resolved once

  struct Connection {
    beast::tcp_stream stream;
    beast::flat_buffer buffer;
    std::chrono::steady_clock::time_point last_used;
    explicit Connection(asio::any_io_executor ex) : stream(ex) {}
  };
  std::vector<std::unique_ptr<Connection>> idle;

  awaitable<result<std::unique_ptr<Connection>>> connect() {
    if (endpoints.empty()) {
      tcp::resolver resolver(executor);
      auto [ec, results] = co_await resolver.async_resolve(host, port, no_throw);
      if (ec) co_return ec;
      endpoints = std::move(results);
    }
    auto connection = std::make_unique<Connection>(executor);
    connection->stream.expires_after(options.timeout);
    auto [ec, endpoint] = co_await connection->stream.async_connect(endpoints, no_throw);
    if (ec) co_return ec;
    connection->stream.socket().set_option(tcp::no_delay(true));
    co_return std::move(connection);
  }

  // Servers that write a response in two segments without TCP_NODELAY (uWSGI's HTTP router
  // does) would otherwise wait for our delayed ACK: 40 ms on every reused connection.
  static void quick_ack(Connection& c) {
    int one = 1;
    setsockopt(c.stream.socket().native_handle(), IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
  }

  // One request and its response on one connection.
  awaitable<result<HttpResponse>> exchange(Connection& c, const http::request<http::string_body>& req,
                                           bool& keep_alive) {
    c.stream.expires_after(options.timeout);
    auto [write_ec, written] = co_await http::async_write(c.stream, req, no_throw);
    if (write_ec) co_return write_ec;
    quick_ack(c);
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    auto [read_ec, read] = co_await http::async_read(c.stream, c.buffer, parser, no_throw);
    if (read_ec) co_return read_ec;
    auto& res = parser.get();
    keep_alive = res.keep_alive();
    co_return HttpResponse{int(res.result_int()), std::move(res.body())};
  }
};

HttpClient::HttpClient(asio::any_io_executor executor, HttpClientOptions options)
    : impl_(std::make_shared<Impl>()) {
  impl_->executor = std::move(executor);
  impl_->options = std::move(options);
  auto url = boost::urls::parse_uri(impl_->options.url);
  if (url) {
    impl_->host = std::string(url->host());
    impl_->port = url->has_port() ? std::string(url->port()) : "80";
    impl_->base_path = std::string(url->path());
    while (!impl_->base_path.empty() && impl_->base_path.back() == '/') impl_->base_path.pop_back();
  }
  impl_->host_header = impl_->host + ":" + impl_->port;
}

HttpClient::~HttpClient() = default;

const std::string& HttpClient::url() const { return impl_->options.url; }

awaitable<result<HttpResponse>> HttpClient::request(HttpRequest request) {
  auto impl = impl_;  // keeps the pool alive across suspension
  if (impl->host.empty()) co_return make_error_code(errc::invalid_config);

  http::request<http::string_body> req{http::string_to_verb(request.method),
                                       impl->base_path + request.target, 11};
  req.set(http::field::host, impl->host_header);
  req.set(http::field::user_agent, "toyvm/" TOYVM_VERSION);
  req.set(http::field::accept, "application/json");
  for (auto& [name, value] : request.headers) req.set(name, value);
  if (!request.body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = std::move(request.body);
  }
  req.keep_alive(true);
  req.prepare_payload();

  // A reused connection may have been closed by the server while idle: if it fails, the
  // request goes once more on a fresh connection.
  auto now = std::chrono::steady_clock::now();
  while (!impl->idle.empty()) {
    std::unique_ptr<Impl::Connection> connection = std::move(impl->idle.back());
    impl->idle.pop_back();
    if (now - connection->last_used > impl->options.max_idle) continue;
    bool keep_alive = false;
    auto response = co_await impl->exchange(*connection, req, keep_alive);
    if (!response) {
      spdlog::debug("http {}: reused connection failed: {}", impl->options.url, response.error().message());
      continue;
    }
    if (keep_alive) {
      connection->last_used = std::chrono::steady_clock::now();
      impl->idle.push_back(std::move(connection));
    }
    co_return response;
  }

  auto connection = co_await impl->connect();
  if (!connection) co_return connection.error();
  bool keep_alive = false;
  auto response = co_await impl->exchange(**connection, req, keep_alive);
  if (response && keep_alive) {
    (*connection)->last_used = std::chrono::steady_clock::now();
    impl->idle.push_back(std::move(*connection));
  }
  co_return response;
}

}  // namespace toyvm
