// The HTTP clients (Placement's and image downloads) against a listener in the test: which
// addresses and names they reach, and what they send; and the servers' listen addresses.
#include "clients/download.hpp"
#include "clients/http.hpp"
#include "core/address.hpp"
#include "core/sha256.hpp"
#include "services/metadata_http.hpp"
#include "services/metrics_http.hpp"

#include "catch_result.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

using namespace toyvm;
using tcp = asio::ip::tcp;

namespace {

// Answers requests on one connection with 200 and `body`, and keeps what the last one sent
// up to the blank line.
struct OneAnswer {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::string request_head;
  int answers = 1;    // requests answered on the connection
  size_t piece = 0;   // each answer written this many bytes at a time; 0: at once
  int accepted = 0;

  // False when the address cannot be bound (a host without IPv6).
  bool listen(const std::string& address) {
    error_code ec;
    tcp::endpoint at(asio::ip::make_address(address), 0);
    acceptor.open(at.protocol(), ec);
    if (!ec) acceptor.bind(at, ec);
    if (!ec) acceptor.listen(4, ec);
    return !ec;
  }

  std::string port() const { return std::to_string(acceptor.local_endpoint().port()); }

  // Serves `body` while `client` runs; the loop ends when the client is done or after 10 s.
  void run(const std::string& body, std::function<awaitable<void>()> client) {
    // Named: a coroutine reaches its lambda's captures through the lambda, which must outlive it.
    auto serve = [&]() -> awaitable<void> {
      auto [accept_ec, socket] = co_await acceptor.async_accept(asio::as_tuple(use_awaitable));
      if (accept_ec) co_return;
      ++accepted;
      std::string head;
      for (int i = 0; i < answers; ++i) {
        auto [read_ec, n] = co_await asio::async_read_until(socket, asio::dynamic_buffer(head), "\r\n\r\n",
                                                            asio::as_tuple(use_awaitable));
        if (read_ec) co_return;
        request_head = head.substr(0, n);
        head.erase(0, n);
        std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
        const size_t step = piece ? piece : answer.size();
        for (size_t at = 0; at < answer.size(); at += step)
          co_await asio::async_write(socket, asio::buffer(answer.data() + at, std::min(step, answer.size() - at)),
                                     asio::as_tuple(use_awaitable));
      }
    };
    auto ask = [&]() -> awaitable<void> {
      co_await client();
      io.stop();
    };
    asio::co_spawn(io, serve(), asio::detached);
    asio::co_spawn(io, ask(), asio::detached);
    asio::steady_timer deadline(io, std::chrono::seconds(10));
    deadline.async_wait([&](auto) { io.stop(); });
    io.run();
  }
};

// One GET by HttpClient to `url_host` at a listener on `listen_address`. Nothing when the
// address cannot be bound.
std::optional<std::string> placement_client_gets(const std::string& listen_address, const std::string& url_host) {
  OneAnswer server;
  if (!server.listen(listen_address)) return std::nullopt;
  HttpClient client(server.io.get_executor(),
                    HttpClientOptions{"http://" + url_host + ":" + server.port(), std::chrono::milliseconds(5'000), {}, {}});
  std::optional<result<HttpResponse>> response;
  server.run("ok", [&]() -> awaitable<void> {
    HttpRequest request;  // a named argument: GCC 12 destroys a temporary in co_await twice
    request.target = "/resource_providers";
    response = co_await client.request(std::move(request));
  });
  REQUIRE(response.has_value());
  REQUIRE(response->has_value());
  CHECK((*response)->status == 200);
  CHECK((*response)->body == "ok");
  CHECK(server.request_head.rfind("GET /resource_providers HTTP/1.1\r\n", 0) == 0);
  return server.request_head;
}

}  // namespace

TEST_CASE("the HTTP client reaches an IPv4 address, an IPv6 address and a name", "[http]") {
  SECTION("IPv4") {
    auto head = placement_client_gets("127.0.0.1", "127.0.0.1");
    REQUIRE(head);
    CHECK(head->find("Host: 127.0.0.1:") != std::string::npos);
  }
  SECTION("IPv6, in brackets in the URL and the Host header") {
    auto head = placement_client_gets("::1", "[::1]");
    if (!head) {
      WARN("this host has no IPv6 loopback");
      return;
    }
    CHECK(head->find("Host: [::1]:") != std::string::npos);
  }
  SECTION("a name, resolved") {
    auto head = placement_client_gets("127.0.0.1", "localhost");
    REQUIRE(head);
    CHECK(head->find("Host: localhost:") != std::string::npos);
  }
}

// uWSGI's HTTP router writes 4 KB at a time: each answer is read whole, and the connection
// kept for the next request.
TEST_CASE("the HTTP client reads an answer written in pieces, twice on one connection", "[http]") {
  OneAnswer server;
  REQUIRE(server.listen("127.0.0.1"));
  server.answers = 2;
  server.piece = 4096;
  std::string body(9000, 'x');
  body.back() = 'y';
  HttpClient client(server.io.get_executor(), HttpClientOptions{"http://127.0.0.1:" + server.port()});
  std::vector<result<HttpResponse>> responses;
  server.run(body, [&]() -> awaitable<void> {
    for (int i = 0; i < 2; ++i) {
      HttpRequest request;
      request.target = "/allocation_candidates";
      responses.push_back(co_await client.request(std::move(request)));
    }
  });
  REQUIRE(responses.size() == 2);
  for (auto& response : responses) {
    INFO((response ? "" : response.error().message()));
    REQUIRE(response.has_value());
    CHECK(response->status == 200);
    CHECK(response->body == body);
  }
  CHECK(server.accepted == 1);
}

TEST_CASE("the HTTP client says so when nothing listens", "[http]") {
  asio::io_context io;
  // A port just bound and released: nothing listens there now.
  tcp::acceptor probe(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const auto port = probe.local_endpoint().port();
  probe.close();
  HttpClient client(io.get_executor(),
                    HttpClientOptions{"http://127.0.0.1:" + std::to_string(port), std::chrono::milliseconds(5'000), {}, {}});
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

// A schedule opens Placement's connection first, so that its request is on the wire before
// etcd's client starts: the request goes on that connection.
TEST_CASE("a request after a preconnect goes on the connection it opened", "[http]") {
  OneAnswer server;
  REQUIRE(server.listen("127.0.0.1"));
  HttpClient client(server.io.get_executor(), HttpClientOptions{"http://127.0.0.1:" + server.port()});
  std::optional<result<HttpResponse>> response;
  int accepted_before_request = -1;
  server.run("ok", [&]() -> awaitable<void> {
    co_await client.preconnect();
    co_await client.preconnect();  // one is open already: nothing more
    // Let the listener take what has arrived before the request is made.
    asio::steady_timer settle(server.io, std::chrono::milliseconds(50));
    co_await settle.async_wait(use_awaitable);
    accepted_before_request = server.accepted;
    HttpRequest request;
    request.target = "/allocation_candidates";
    response = co_await client.request(std::move(request));
  });
  CHECK(accepted_before_request == 1);
  REQUIRE(response.has_value());
  REQUIRE(response->has_value());
  CHECK((*response)->body == "ok");
  CHECK(server.accepted == 1);
}

// Placement down: the preconnect was the attempt, so the request that follows does not wait
// for a second one (a caller's retry does); the request after that connects anew.
TEST_CASE("a failed preconnect is the next request's error, and the one after connects again", "[http]") {
  asio::io_context io;
  const auto loopback = asio::ip::make_address("127.0.0.1");
  tcp::acceptor probe(io, tcp::endpoint(loopback, 0));
  const auto port = probe.local_endpoint().port();
  probe.close();  // nothing listens there now
  HttpClient client(io.get_executor(), HttpClientOptions{"http://127.0.0.1:" + std::to_string(port)});
  std::optional<result<HttpResponse>> first, second;
  auto answer_once = [](tcp::acceptor& listener) -> awaitable<void> {
    auto socket = co_await listener.async_accept(use_awaitable);
    std::string head;
    co_await asio::async_read_until(socket, asio::dynamic_buffer(head), "\r\n\r\n", use_awaitable);
    std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    co_await asio::async_write(socket, asio::buffer(answer), use_awaitable);
  };
  auto steps = [&]() -> awaitable<void> {
    co_await client.preconnect();
    tcp::acceptor listener(io, tcp::endpoint(loopback, port));  // Placement is back
    HttpRequest request;
    request.target = "/";
    first = co_await client.request(request);
    asio::co_spawn(io, answer_once(listener), asio::detached);
    second = co_await client.request(request);
  };
  asio::co_spawn(io, steps(), [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  io.run_for(std::chrono::seconds(10));
  REQUIRE(first.has_value());
  REQUIRE_FALSE(first->has_value());
  CHECK(first->error() == asio::error::connection_refused);
  REQUIRE(second.has_value());
  REQUIRE(second->has_value());
  CHECK((*second)->body == "ok");
}

TEST_CASE("an image download reaches an IPv6 address in brackets, as its URL has it", "[http]") {
  OneAnswer server;
  if (!server.listen("::1")) {
    WARN("this host has no IPv6 loopback");
    return;
  }
  const std::string image = "not much of an image";
  int fd = memfd_create("image", 0);
  REQUIRE(fd >= 0);
  DownloadResult downloaded;
  server.run(image, [&]() -> awaitable<void> {
    DownloadRequest request;
    request.host = "[::1]";
    request.port = server.port();
    request.target = "/base.raw";
    request.max_bytes = 1 << 20;
    downloaded = co_await download_to_fd(server.io.get_executor(), std::move(request), fd);
  });
  CHECK(downloaded.error == "");
  CHECK(downloaded.bytes == image.size());
  Sha256 sha;
  sha.update(image.data(), image.size());
  CHECK(downloaded.sha256 == sha.hex());
  CHECK(server.request_head.find("Host: [::1]:" + server.port() + "\r\n") != std::string::npos);
  close(fd);
}

TEST_CASE("listen addresses: IPv4, IPv6 in brackets, and what is not one", "[http]") {
  auto v4 = MetadataHttpServer::parse_listen("169.254.169.254:80");
  REQUIRE(v4);
  CHECK(v4->address() == asio::ip::make_address("169.254.169.254"));
  CHECK(v4->port() == 80);
  auto v6 = MetadataHttpServer::parse_listen("[::1]:9100");
  REQUIRE(v6);
  CHECK(v6->address() == asio::ip::make_address("::1"));
  CHECK(v6->port() == 9100);
  // An IPv4 address written as IPv6 is that IPv4 address.
  auto mapped = MetadataHttpServer::parse_listen("[::ffff:169.254.169.254]:80");
  REQUIRE(mapped);
  CHECK(mapped->address() == asio::ip::make_address("169.254.169.254"));
  auto any6 = MetadataHttpServer::parse_listen("[::]:8775");
  REQUIRE(any6);
  CHECK(any6->address() == asio::ip::make_address("::"));
  for (const std::string bad : {"", "127.0.0.1", "[::1]", "::1:9100", "fd00::a:10", "127.0.0.1:0", "127.0.0.1:65536",
                                "127.0.0.1:99999", "127.0.0.1:80x", "127.0.0.1:", "localhost:80", "[127.0.0.1:80",
                                "[::1]:", "user@127.0.0.1:80", "http://127.0.0.1:80", "127.0.0.1:80/", "1.2.3:80",
                                "[v1.x]:80"})
    CHECK_FALSE(MetadataHttpServer::parse_listen(bad));
}

TEST_CASE("hosts lose the brackets of an IPv6 address, ports are read whole", "[http]") {
  CHECK(bare_host("[::1]") == "::1");
  CHECK(bare_host("[fd00::5]") == "fd00::5");
  CHECK(bare_host("127.0.0.1") == "127.0.0.1");
  CHECK(bare_host("placement.example") == "placement.example");
  CHECK(parse_port("8778") == uint16_t(8778));
  CHECK(parse_port("65535") == uint16_t(65535));
  CHECK(parse_port("1") == uint16_t(1));
  for (std::string_view bad : {"", "0", "080", "65536", "99999", "80x", " 80", "-1", "+80"}) CHECK_FALSE(parse_port(bad));
  CHECK(bare_host("[::ffff:10.0.0.1]") == "::ffff:10.0.0.1");
  CHECK(bare_host("::1") == "::1");  // bare already
  CHECK(bare_host("[::1]:80") == "[::1]:80");  // not a host alone: left as it is
}

TEST_CASE("IP addresses are told from names", "[http]") {
  for (std::string_view address : {"127.0.0.1", "0.0.0.0", "::1", "::", "fd00::5", "::ffff:169.254.169.254"})
    CHECK(is_ip_address(address));
  for (std::string_view name : {"", "localhost", "etcd.example", "[::1]", "127.0.0.1:80", "1.2.3", "01.2.3.4",
                                "256.1.1.1", "fe80::1%eth0", "::g"})
    CHECK_FALSE(is_ip_address(name));
}

TEST_CASE("endpoints are http or https URLs that name a host", "[http]") {
  for (std::string_view url : {"http://127.0.0.1:8778", "https://placement.example/placement", "http://[::1]:2379",
                               "http://etcd.example"})
    CHECK(is_http_url(url));
  for (std::string_view bad : {"", "localhost:8080", "127.0.0.1:2379", "ftp://etcd.example", "http:///path", "http://",
                               "http://:80", "http://etcd example", "http://[::1:2379", "HTTP://etcd.example"})
    CHECK_FALSE(is_http_url(bad));
}

TEST_CASE("endpoints split into host and port, IPv6 in brackets or bare", "[http]") {
  struct Case {
    std::string endpoint, host, port;
  };
  for (const Case& c : std::vector<Case>{{"http://127.0.0.1:2379", "127.0.0.1", "2379"},
                                         {"https://etcd.example:2379/", "etcd.example", "2379"},
                                         {"etcd.example", "etcd.example", "2379"},
                                         {"http://etcd.example:", "etcd.example", "2379"},
                                         {"http://[::1]:12379", "::1", "12379"},
                                         {"http://[::1]", "::1", "2379"},
                                         {"[fd00::5]:2379", "fd00::5", "2379"},
                                         {"fd00::5", "fd00::5", "2379"},
                                         {"127.0.0.1", "127.0.0.1", "2379"},
                                         {"127.0.0.1:22379", "127.0.0.1", "22379"},
                                         {"localhost:22379", "localhost", "22379"},
                                         {"etcd.example:2379/", "etcd.example", "2379"},
                                         {"https://user@etcd.example:2379/v3", "etcd.example", "2379"},
                                         {"http://[fd00::5]:", "fd00::5", "2379"},
                                         // A bad port is kept for the resolver to refuse.
                                         {"http://etcd.example:99999", "etcd.example", "99999"},
                                         // Not a host and port at all: whole, for the same.
                                         {"http://[::1", "http://[::1", "2379"}}) {
    HostPort split = split_host_port(c.endpoint, "2379");
    CHECK(split.host == c.host);
    CHECK(split.port == c.port);
  }
}

TEST_CASE("metrics refuse every address a guest reaches, however it is written", "[http]") {
  asio::io_context io;
  for (const std::string guests : {"169.254.169.254:9100", "[::ffff:169.254.169.254]:9100", "0.0.0.0:9100", "[::]:9100",
                                   "10.0.0.1:9100"}) {
    auto refused = serve_metrics(io, guests, {"10.0.0.1:80"});
    REQUIRE_FALSE(refused);
    CHECK(refused.error() == errc::invalid_config);
    CHECK_THAT(said(refused), Catch::Contains("guests reach"));
  }
  CHECK_THAT(said(serve_metrics(io, "::1:9100", {})), Catch::Contains("expected ADDRESS:PORT"));
}

namespace {

// Accepts every connection and answers each request on it after `delay`, counting the
// connections and the requests being answered at once.
struct SlowServer {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::chrono::milliseconds delay{20};
  int accepted = 0, answering = 0, most_at_once = 0;

  std::string listen() {
    tcp::endpoint at(asio::ip::make_address("127.0.0.1"), 0);
    acceptor.open(at.protocol());
    acceptor.bind(at);
    acceptor.listen(64);
    return "http://127.0.0.1:" + std::to_string(acceptor.local_endpoint().port());
  }

  awaitable<void> answer(tcp::socket socket) {
    std::string head;
    for (;;) {
      auto [read_ec, n] = co_await asio::async_read_until(socket, asio::dynamic_buffer(head), "\r\n\r\n",
                                                          asio::as_tuple(use_awaitable));
      if (read_ec) co_return;
      head.erase(0, n);
      most_at_once = std::max(most_at_once, ++answering);
      asio::steady_timer wait(io, delay);
      co_await wait.async_wait(asio::as_tuple(use_awaitable));
      --answering;
      const std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
      co_await asio::async_write(socket, asio::buffer(answer), asio::as_tuple(use_awaitable));
    }
  }

  awaitable<void> serve() {
    for (;;) {
      auto [ec, socket] = co_await acceptor.async_accept(asio::as_tuple(use_awaitable));
      if (ec) co_return;
      ++accepted;
      asio::co_spawn(io, answer(std::move(socket)), asio::detached);
    }
  }
};

awaitable<void> get_into(HttpClient& client, std::chrono::milliseconds timeout, std::vector<result<HttpResponse>>& into) {
  HttpRequest request;
  request.target = "/";
  request.timeout = timeout;
  into.push_back(co_await client.request(std::move(request)));
}

}  // namespace

TEST_CASE("the HTTP client sends at most max_in_flight requests at once, on as many connections; the rest wait "
          "their turn or their timeout", "[http]") {
  SlowServer server;
  HttpClientOptions options{server.listen(), std::chrono::milliseconds(5'000), std::chrono::milliseconds(20'000), {}};
  options.max_in_flight = 2;
  HttpClient client(server.io.get_executor(), options);
  std::vector<result<HttpResponse>> answers;
  SECTION("eight at once: each answered, two at a time on two connections") {
    std::vector<awaitable<void>> asking;
    for (int i = 0; i < 8; ++i) asking.push_back(get_into(client, std::chrono::milliseconds(5'000), answers));
    asio::co_spawn(server.io, server.serve(), asio::detached);
    asio::co_spawn(server.io, run_together(std::move(asking)), [&](std::exception_ptr) { server.io.stop(); });
    server.io.run_for(std::chrono::seconds(10));
    REQUIRE(answers.size() == 8);
    for (const auto& answer : answers) CHECK((answer && answer->status == 200));
    CHECK(server.most_at_once == 2);
    CHECK(server.accepted == 2);
  }
  SECTION("a request whose turn does not come within its timeout is refused, never sent") {
    server.delay = std::chrono::milliseconds(500);
    std::vector<awaitable<void>> asking;
    for (int i = 0; i < 2; ++i) asking.push_back(get_into(client, std::chrono::milliseconds(5'000), answers));
    asking.push_back(get_into(client, std::chrono::milliseconds(50), answers));
    asio::co_spawn(server.io, server.serve(), asio::detached);
    asio::co_spawn(server.io, run_together(std::move(asking)), [&](std::exception_ptr) { server.io.stop(); });
    server.io.run_for(std::chrono::seconds(10));
    REQUIRE(answers.size() == 3);
    REQUIRE_FALSE(answers.front());  // the third, refused first
    CHECK(answers.front().error() == errc::timeout);
    CHECK((answers[1] && answers[2]));
    CHECK(server.accepted == 2);
  }
}
