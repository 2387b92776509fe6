#include "clients/http.hpp"

#include "core/address.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/url/parse.hpp>
#include <spdlog/spdlog.h>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <deque>

namespace toyvm {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct HttpClient::Impl {
  asio::any_io_executor executor;
  HttpClientOptions options;
  std::string host;
  std::string port;
  std::string base_path;
  std::string host_header;  // as the URL has it: an IPv6 address in brackets
  std::vector<tcp::endpoint> endpoints;  // an address, or the name resolved once
  std::optional<asio::ssl::context> tls;  // https only
  error_code tls_error;                   // loading the CA failed: every request fails so

  // Plain TCP, or TLS over it.
  struct Connection {
    std::optional<beast::tcp_stream> plain;
    std::optional<beast::ssl_stream<beast::tcp_stream>> secure;
    beast::flat_buffer buffer;
    std::chrono::steady_clock::time_point last_used;
    beast::tcp_stream& transport() { return secure ? secure->next_layer() : *plain; }
  };
  std::vector<std::unique_ptr<Connection>> idle;  // the most recently used last
  Error preconnect_error;        // the next request's answer: the attempt to connect was made
  size_t in_flight = 0;
  struct Waiter {
    asio::steady_timer timer;
    bool handed = false;  // a request that ended handed its turn over
  };
  std::deque<std::shared_ptr<Waiter>> waiting;  // requests waiting their turn, oldest first

  // A turn to send: at once while fewer than max_in_flight are in flight, else when one ends
  // and hands its turn over; false: none within `timeout` (or the wait was cancelled).
  awaitable<bool> take_turn(std::chrono::milliseconds timeout) {
    if (in_flight < std::max<size_t>(options.max_in_flight, 1)) {
      ++in_flight;
      co_return true;
    }
    auto waiter = std::make_shared<Waiter>(Waiter{asio::steady_timer(executor, timeout)});
    waiting.push_back(waiter);
    co_await waiter->timer.async_wait(no_throw);
    if (waiter->handed) co_return true;
    std::erase(waiting, waiter);
    co_return false;
  }

  void end_turn() {
    if (waiting.empty()) {
      --in_flight;
      return;
    }
    std::shared_ptr<Waiter> next = std::move(waiting.front());
    waiting.pop_front();
    next->handed = true;
    next->timer.cancel();
  }

  // Kept for the next request; idle ones too old to be reused are closed.
  void keep(std::unique_ptr<Connection> connection) {
    const auto now = std::chrono::steady_clock::now();
    connection->last_used = now;
    std::erase_if(idle, [&](const auto& old) { return now - old->last_used > options.max_idle; });
    idle.push_back(std::move(connection));
  }

  awaitable<result<std::unique_ptr<Connection>>> connect() {
    if (endpoints.empty()) {
      tcp::resolver resolver(executor);
      auto [ec, results] = co_await resolver.async_resolve(host, port, no_throw);
      if (ec) co_return ec;
      std::vector<tcp::endpoint> resolved;
      for (const auto& entry : results) resolved.push_back(entry.endpoint());
      endpoints = std::move(resolved);  // another request may have resolved it meanwhile
    }
    auto connection = std::make_unique<Connection>();
    // Beast reads as much as the buffer has room for, at least 512 bytes: without room, a
    // 20 KB answer of candidates took forty reads.
    connection->buffer.reserve(64 << 10);
    connection->plain.emplace(executor);
    connection->plain->expires_after(options.timeout);
    auto [ec, endpoint] = co_await connection->plain->async_connect(endpoints, no_throw);
    if (ec) co_return ec;
    connection->plain->socket().set_option(tcp::no_delay(true));
    if (!tls) co_return std::move(connection);

    // The server's certificate must chain to the CA and name the host (SNI says which; it
    // names hosts only, never an address).
    connection->secure.emplace(std::move(*connection->plain), *tls);
    connection->plain.reset();
    auto& secure = *connection->secure;
    secure.set_verify_callback(asio::ssl::host_name_verification(host));
    if (!is_ip_address(host)) SSL_set_tlsext_host_name(secure.native_handle(), host.c_str());
    auto [handshake_ec] = co_await secure.async_handshake(asio::ssl::stream_base::client, no_throw);
    if (handshake_ec) co_return handshake_ec;
    co_return std::move(connection);
  }

  // A server that writes a response in pieces without TCP_NODELAY (uWSGI's HTTP router: 4 KB
  // at a time) holds each piece until the one before is acknowledged, and on a reused
  // connection the kernel delays that ACK by 40 ms: 27 of 100 answers of candidates (9 KB)
  // stalled so when it was asked for once per answer. It is asked for after every read: the
  // setting does not stick.
  static void quick_ack(Connection& c) {
    int one = 1;
    setsockopt(c.transport().socket().native_handle(), IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
  }

  // One request and its response on one connection.
  awaitable<result<HttpResponse>> exchange(Connection& c, const http::request<http::string_body>& req,
                                           std::chrono::milliseconds timeout, bool& keep_alive) {
    if (c.secure) co_return co_await exchange_on(*c.secure, c, req, timeout, keep_alive);
    co_return co_await exchange_on(*c.plain, c, req, timeout, keep_alive);
  }

  template <class Stream>
  awaitable<result<HttpResponse>> exchange_on(Stream& stream, Connection& c, const http::request<http::string_body>& req,
                                              std::chrono::milliseconds timeout, bool& keep_alive) {
    c.transport().expires_after(timeout.count() > 0 ? timeout : options.timeout);
    auto [write_ec, written] = co_await http::async_write(stream, req, no_throw);
    if (write_ec) co_return write_ec;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    do {
      auto [read_ec, read] = co_await http::async_read_some(stream, c.buffer, parser, no_throw);
      if (read_ec) co_return read_ec;
      quick_ack(c);
    } while (!parser.is_done());
    auto& res = parser.get();
    keep_alive = res.keep_alive();
    co_return HttpResponse{int(res.result_int()), std::move(res.body()), std::string(res["X-Subject-Token"])};
  }
};

HttpClient::HttpClient(asio::any_io_executor executor, HttpClientOptions options)
    : impl_(std::make_shared<Impl>()) {
  impl_->executor = std::move(executor);
  impl_->options = std::move(options);
  auto url = boost::urls::parse_uri(impl_->options.url);
  if (url) {
    const bool https = url->scheme() == "https";
    impl_->host = std::string(url->host_address());  // an IPv6 address without its brackets
    impl_->port = !url->port().empty() ? std::string(url->port()) : https ? "443" : "80";
    impl_->host_header = std::string(url->host()) + ":" + impl_->port;
    // An address needs no resolver, whose first use starts a thread: a short command's cost.
    error_code not_address;
    auto address = asio::ip::make_address(impl_->host, not_address);
    if (auto port = parse_port(impl_->port); !not_address && port) impl_->endpoints.emplace_back(address, *port);
    if (https) {
      impl_->tls.emplace(asio::ssl::context::tls_client);
      impl_->tls->set_verify_mode(asio::ssl::verify_peer);
      if (impl_->options.ca_file.empty()) {
        impl_->tls->set_default_verify_paths(impl_->tls_error);
      } else {
        impl_->tls->load_verify_file(impl_->options.ca_file, impl_->tls_error);
      }
    }
    impl_->base_path = std::string(url->path());
    while (!impl_->base_path.empty() && impl_->base_path.back() == '/') impl_->base_path.pop_back();
  }
}

HttpClient::~HttpClient() = default;

const std::string& HttpClient::url() const { return impl_->options.url; }

awaitable<void> HttpClient::preconnect() {
  auto impl = impl_;
  if (impl->host.empty() || impl->tls_error || !impl->idle.empty()) co_return;
  auto connection = co_await impl->connect();
  if (!connection) {
    impl->preconnect_error = connection.error();
    co_return;
  }
  impl->keep(std::move(*connection));
}

awaitable<result<HttpResponse>> HttpClient::request(HttpRequest request) {
  auto impl = impl_;  // keeps the pool alive across suspension
  if (impl->host.empty())
    co_return Error(errc::invalid_config, fmt::format("'{}' is not an HTTP URL", impl->options.url));
  if (impl->tls_error) co_return Error(impl->tls_error, "loading the CA: " + impl->tls_error.message());
  if (Error failed = std::exchange(impl->preconnect_error, {}); failed.code) co_return failed;

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

  const std::chrono::milliseconds timeout = request.timeout.count() > 0 ? request.timeout : impl->options.timeout;
  const bool my_turn = co_await impl->take_turn(timeout);
  if (!my_turn)
    co_return Error(errc::timeout, fmt::format("{}: no turn to send within {} ms ({} requests in flight)",
                                               impl->options.url, timeout.count(), impl->in_flight));
  struct Turn {
    std::shared_ptr<Impl> impl;
    ~Turn() { impl->end_turn(); }
  } turn{impl};

  // A reused connection may have been closed by the server while idle: if it fails, the
  // request goes once more on a fresh connection.
  auto now = std::chrono::steady_clock::now();
  while (!impl->idle.empty()) {
    std::unique_ptr<Impl::Connection> connection = std::move(impl->idle.back());
    impl->idle.pop_back();
    if (now - connection->last_used > impl->options.max_idle) continue;
    bool keep_alive = false;
    auto response = co_await impl->exchange(*connection, req, request.timeout, keep_alive);
    if (!response) {
      spdlog::debug("http {}: reused connection failed: {}", impl->options.url, response.error().message());
      // A server that took too long may still carry the request out: not sent twice.
      if (response.error() == beast::error::timeout) co_return response.error();
      continue;
    }
    if (keep_alive) impl->keep(std::move(connection));
    co_return response;
  }

  auto connection = co_await impl->connect();
  if (!connection) co_return connection.error();
  bool keep_alive = false;
  auto response = co_await impl->exchange(**connection, req, request.timeout, keep_alive);
  if (response && keep_alive) impl->keep(std::move(*connection));
  co_return response;
}

bool timed_out(const Error& error) { return error == beast::error::timeout; }

}  // namespace toyvm
