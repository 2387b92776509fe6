#pragma once
// A small HTTP/1.1 client over Boost.Beast: kept-alive connections reused across requests,
// a timeout per request, and no Beast type in this header.

#include "core/async.hpp"
#include "core/error.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace toyvm {

struct HttpRequest {
  std::string method = "GET";
  std::string target;  // path and query, joined to the endpoint's base path
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;    // sent as application/json when not empty
  std::chrono::milliseconds timeout{0};  // 0: the client's
};

struct HttpResponse {
  int status = 0;
  std::string body;
  std::string subject_token;  // Keystone's X-Subject-Token header, when present
};

struct HttpClientOptions {
  std::string url;  // http://host:port[/base] or https://...
  std::chrono::milliseconds timeout{10'000};
  std::chrono::milliseconds max_idle{20'000};  // older idle connections are not reused
  std::string ca_file{};  // https: the CA that signed the server's certificate; empty: the system's
  // Requests in flight at once, so connections open at once; more wait their turn. Without a
  // bound, a process of many simulated hosts opened one connection for each host asking at
  // once (15,000 to Placement), whose ports made every new connection's search for one slow.
  size_t max_in_flight = 32;
};

// A request's error says the server took too long to answer: it may still carry the request
// out, so a request that changes something is not sent again.
bool timed_out(const Error& error);

class HttpClient {
 public:
  HttpClient(asio::any_io_executor executor, HttpClientOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Errors are transport failures (connection refused, timeout); any HTTP status is a response.
  awaitable<result<HttpResponse>> request(HttpRequest request);
  // Opens a connection for the next request unless one is open: that request then leaves as
  // soon as it is asked for, before whatever else starts meanwhile. If it cannot, the next
  // request fails with that error (the attempt has been made; a caller's retry makes another).
  awaitable<void> preconnect();

  const std::string& url() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace toyvm
