#include "clients/download.hpp"

#include "core/address.hpp"
#include "core/sha256.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace toyvm {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using boost::system::error_code;

DownloadResult failed(std::string error) {
  DownloadResult result;
  result.error = std::move(error);
  return result;
}

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= size_t(n);
  }
  return true;
}

// Sends the GET and copies the body into `fd`; works on a plain or a TLS stream.
template <class Stream>
awaitable<DownloadResult> fetch(Stream& stream, const DownloadRequest& request, int fd) {
  DownloadResult result;
  auto& socket = beast::get_lowest_layer(stream);
  http::request<http::empty_body> get{http::verb::get, request.target, 11};
  const bool default_port = request.port == (request.https ? "443" : "80");
  get.set(http::field::host, default_port ? request.host : request.host + ":" + request.port);
  get.set(http::field::user_agent, "toyvm/" TOYVM_VERSION);
  get.set(http::field::connection, "close");
  socket.expires_after(request.idle_timeout);
  auto [write_error, written] = co_await http::async_write(stream, get, asio::as_tuple(use_awaitable));
  if (write_error) co_return failed("sending the request: " + write_error.message());

  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(request.max_bytes);
  auto [header_error, header_bytes] = co_await http::async_read_header(stream, buffer, parser, asio::as_tuple(use_awaitable));
  if (header_error) co_return failed("reading the response: " + header_error.message());
  int status = parser.get().result_int();
  if (status != 200) co_return failed(fmt::format("the server answered HTTP {}", status));
  if (auto length = parser.content_length(); length && *length > request.max_bytes)
    co_return failed(fmt::format("the image is {} bytes, over the limit of {}", *length, request.max_bytes));

  Sha256 sha;
  std::vector<char> chunk(1 << 16);
  while (!parser.is_done()) {
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    socket.expires_after(request.idle_timeout);
    auto [error, n] = co_await http::async_read(stream, buffer, parser, asio::as_tuple(use_awaitable));
    if (error == http::error::need_buffer) error = {};
    if (error == http::error::body_limit)
      co_return failed(fmt::format("the image is over the limit of {} bytes", request.max_bytes));
    if (error) co_return failed("reading the image: " + error.message());
    size_t got = chunk.size() - parser.get().body().size;
    sha.update(chunk.data(), got);
    result.bytes += got;
    if (!write_all(fd, chunk.data(), got)) co_return failed(std::string("writing: ") + std::strerror(errno));
  }
  result.sha256 = sha.hex();
  co_return result;
}

}  // namespace

awaitable<DownloadResult> download_to_fd(asio::any_io_executor executor, DownloadRequest request, int fd) {
  // The URL's host, an IPv6 address in brackets as the Host header wants it; the resolver,
  // the certificate check and SNI want it bare.
  const std::string name = bare_host(request.host);
  tcp::resolver resolver(executor);
  auto [resolve_error, endpoints] = co_await resolver.async_resolve(name, request.port, asio::as_tuple(use_awaitable));
  if (resolve_error) co_return failed(fmt::format("resolving {}: {}", request.host, resolve_error.message()));
  beast::tcp_stream socket(executor);
  socket.expires_after(request.idle_timeout);
  auto [connect_error, endpoint] = co_await socket.async_connect(endpoints, asio::as_tuple(use_awaitable));
  if (connect_error)
    co_return failed(fmt::format("connecting to {}:{}: {}", request.host, request.port, connect_error.message()));
  if (!request.https) co_return co_await fetch(socket, request, fd);

  asio::ssl::context tls(asio::ssl::context::tls_client);
  error_code ca_error;
  if (request.ca_file.empty()) {
    tls.set_default_verify_paths(ca_error);
  } else {
    tls.load_verify_file(request.ca_file, ca_error);
  }
  if (ca_error) co_return failed("loading CA certificates: " + ca_error.message());
  tls.set_verify_mode(asio::ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> stream(std::move(socket), tls);
  stream.set_verify_callback(asio::ssl::host_name_verification(name));
  if (!is_ip_address(name)) SSL_set_tlsext_host_name(stream.native_handle(), name.c_str());  // SNI names hosts only
  auto [handshake_error] = co_await stream.async_handshake(asio::ssl::stream_base::client, asio::as_tuple(use_awaitable));
  if (handshake_error) co_return failed("TLS handshake: " + handshake_error.message());
  co_return co_await fetch(stream, request, fd);
}

}  // namespace toyvm
