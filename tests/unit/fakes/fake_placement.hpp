#pragma once
// Placement's HTTP face, in the test's own event loop: each request is answered by `answer`
// (204 with no body unless it says otherwise) and kept, so a test can see what the client
// asked. The client under test is the real PlacementClient.

#include "core/async.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/write.hpp>

#include <functional>
#include <list>
#include <string>
#include <vector>

namespace toyvm::fakes {

struct PlacementRequest {
  std::string method, target, body;
};

struct PlacementAnswer {
  int status = 204;
  std::string body;
};

class FakePlacement {
 public:
  std::vector<PlacementRequest> requests;
  std::function<PlacementAnswer(const PlacementRequest&)> answer = [](const PlacementRequest&) {
    return PlacementAnswer{};
  };

  explicit FakePlacement(asio::io_context& io) : acceptor_(io, {asio::ip::make_address("127.0.0.1"), 0}) {
    asio::co_spawn(io, accept(), asio::detached);
  }
  // Ends the listener and every connection, so the loop can run out of work.
  void close() {
    acceptor_.close();
    for (tcp::socket& socket : sockets_) socket.close();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port()); }
  int count(const std::string& method, const std::string& target) const {
    int n = 0;
    for (const PlacementRequest& r : requests) n += r.method == method && r.target == target;
    return n;
  }

 private:
  using tcp = asio::ip::tcp;

  awaitable<void> accept() {
    while (true) {
      auto [ec, socket] = co_await acceptor_.async_accept(asio::as_tuple(use_awaitable));
      if (ec) co_return;
      sockets_.push_back(std::move(socket));
      asio::co_spawn(acceptor_.get_executor(), serve(sockets_.back()), asio::detached);
    }
  }

  awaitable<void> serve(tcp::socket& socket) {
    std::string buffer;
    while (true) {
      auto [ec, head_end] =
          co_await asio::async_read_until(socket, asio::dynamic_buffer(buffer), "\r\n\r\n", asio::as_tuple(use_awaitable));
      if (ec) co_return;
      const std::string head = buffer.substr(0, head_end);
      buffer.erase(0, head_end);
      PlacementRequest request;
      const size_t space = head.find(' ');
      request.method = head.substr(0, space);
      request.target = head.substr(space + 1, head.find(' ', space + 1) - space - 1);
      size_t length = 0;
      for (const char* name : {"Content-Length: ", "content-length: "})
        if (size_t at = head.find(name); at != std::string::npos) length = std::stoul(head.substr(at + 16));
      if (buffer.size() < length) {
        auto [read_ec, n] = co_await asio::async_read(socket, asio::dynamic_buffer(buffer),
                                                      asio::transfer_exactly(length - buffer.size()),
                                                      asio::as_tuple(use_awaitable));
        if (read_ec) co_return;
      }
      request.body = buffer.substr(0, length);
      buffer.erase(0, length);
      requests.push_back(request);
      const PlacementAnswer reply = answer(request);
      std::string response = "HTTP/1.1 " + std::to_string(reply.status) + " X\r\nContent-Type: application/json\r\n" +
                             "Content-Length: " + std::to_string(reply.body.size()) + "\r\n\r\n" + reply.body;
      auto [write_ec, written] = co_await asio::async_write(socket, asio::buffer(response), asio::as_tuple(use_awaitable));
      if (write_ec) co_return;
    }
  }

  tcp::acceptor acceptor_;
  std::list<tcp::socket> sockets_;  // a list: serve() holds a reference to its own
};

}  // namespace toyvm::fakes
