#include "clients/etcd.hpp"

#include "core/address.hpp"
#include "core/backoff.hpp"
#include "core/metrics.hpp"
#include "model/keys.hpp"
#include "rpc.grpc.pb.h"

#include <absl/synchronization/mutex.h>
#include <boost/asio/as_tuple.hpp>
#include <fmt/format.h>
#include <grpc/support/log.h>
#include <grpcpp/grpcpp.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <fstream>
#include <mutex>
#include <thread>
#include <utility>

namespace toyvm {
namespace {

namespace pb = etcdserverpb;

error_code from_status(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK: return {};
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED: return errc::etcd_unavailable;
    case grpc::StatusCode::CANCELLED: return errc::cancelled;
    default: return errc::etcd_error;
  }
}

// For metrics: the few outcomes worth telling apart.
std::string status_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "ok";
    case grpc::StatusCode::UNAVAILABLE: return "unavailable";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "deadline_exceeded";
    case grpc::StatusCode::CANCELLED: return "cancelled";
    case grpc::StatusCode::UNAUTHENTICATED: return "unauthenticated";
    default: return "error";
  }
}

KeyValue from_pb(const mvccpb::KeyValue& kv) {
  return {kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease()};
}

RangeResult from_pb(const pb::RangeResponse& resp) {
  RangeResult out;
  out.revision = resp.header().revision();
  out.more = resp.more();
  out.count = resp.count();
  out.kvs.reserve(resp.kvs_size());
  for (const auto& kv : resp.kvs()) out.kvs.push_back(from_pb(kv));
  return out;
}

void to_pb(const EtcdOp& op, pb::RequestOp& out) {
  switch (op.kind) {
    case EtcdOp::Kind::put: {
      auto* put = out.mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case EtcdOp::Kind::erase: {
      auto* del = out.mutable_request_delete_range();
      del->set_key(op.key);
      del->set_range_end(op.range_end);
      break;
    }
    case EtcdOp::Kind::range: {
      auto* range = out.mutable_request_range();
      range->set_key(op.key);
      range->set_range_end(op.range_end);
      break;
    }
  }
}

void to_pb(const EtcdCompare& cmp, pb::Compare& out) {
  out.set_key(cmp.key);
  out.set_result(static_cast<pb::Compare::CompareResult>(cmp.result));
  switch (cmp.target) {
    case EtcdCompare::Target::version:
      out.set_target(pb::Compare::VERSION);
      out.set_version(cmp.number);
      break;
    case EtcdCompare::Target::create_revision:
      out.set_target(pb::Compare::CREATE);
      out.set_create_revision(cmp.number);
      break;
    case EtcdCompare::Target::mod_revision:
      out.set_target(pb::Compare::MOD);
      out.set_mod_revision(cmp.number);
      break;
    case EtcdCompare::Target::value:
      out.set_target(pb::Compare::VALUE);
      out.set_value(cmp.value);
      break;
  }
}

// "http://127.0.0.1:2379,http://127.0.0.1:22379" -> "ipv4:127.0.0.1:2379,127.0.0.1:22379": one
// channel over every member; pick_first moves to the next address when one fails.
bool uses_tls(const EtcdConfig& config) {
  return std::any_of(config.endpoints.begin(), config.endpoints.end(),
                     [](const std::string& endpoint) { return endpoint.starts_with("https://"); });
}

std::string read_text_file(const std::string& path) {
  if (path.empty()) return {};
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

HostPort split_endpoint(const std::string& endpoint) { return split_host_port(endpoint, "2379"); }

// gRPC's dns:/// target takes one name, its ipv4: and ipv6: targets a list of addresses: the
// members' names are resolved here, once, so that pick_first fails over between all of them
// (IPv4 addresses when there are any, as one target takes one family).
std::string grpc_target(const std::vector<std::string>& endpoints) {
  std::vector<std::string> v4, v6;
  for (const std::string& endpoint : endpoints) {
    HostPort at = split_endpoint(endpoint);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(at.host.c_str(), at.port.c_str(), &hints, &found) != 0) continue;
    for (addrinfo* a = found; a; a = a->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      if (a->ai_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof text);
        v4.push_back(fmt::format("{}:{}", text, at.port));
      } else if (a->ai_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text, sizeof text);
        v6.push_back(fmt::format("[{}]:{}", text, at.port));
      }
    }
    freeaddrinfo(found);
  }
  for (auto* list : {&v4, &v6}) {
    std::sort(list->begin(), list->end());
    list->erase(std::unique(list->begin(), list->end()), list->end());
  }
  if (!v4.empty()) return "ipv4:" + fmt::format("{}", fmt::join(v4, ","));
  if (!v6.empty()) return "ipv6:" + fmt::format("{}", fmt::join(v6, ","));
  // Nothing resolves now: gRPC resolves the first member itself, and again as it reconnects.
  HostPort first = split_endpoint(endpoints.front());
  return fmt::format("dns:///{}:{}", first.host, first.port);
}

// gRPC's completion queue, drained by one thread for the whole process. Each operation's tag
// is a Completion that runs there once and only hands the outcome to the event loop. (gRPC's
// callback API would drain its own queue with two threads that wake each other for every
// response: more threads to start in a one-shot command, more switches in the agent.)
class Completion {
 public:
  explicit Completion(std::function<void(bool ok)> fn) : fn_(std::move(fn)) {}
  void run(bool ok) { fn_(ok); }

 private:
  std::function<void(bool ok)> fn_;
};

Completion* on_completion(std::function<void(bool ok)> fn) { return new Completion(std::move(fn)); }

grpc::CompletionQueue* completion_queue() {
  // Never shut down, like the channels: operations may be pending while the process exits.
  static grpc::CompletionQueue* queue = [] {
    auto* queue = new grpc::CompletionQueue;
    std::thread([queue] {
      void* tag = nullptr;
      bool ok = false;
      while (queue->Next(&tag, &ok)) {
        std::unique_ptr<Completion> completion(static_cast<Completion*>(tag));
        completion->run(ok);
      }
    }).detach();
    return queue;
  }();
  return queue;
}

// A bidirectional stream whose responses are queued for one coroutine. Every pending
// operation holds the stream, so it lives until gRPC has finished with it.
template <class Request, class Response>
class BidiStream final : public std::enable_shared_from_this<BidiStream<Request, Response>> {
 public:
  struct Item {
    std::optional<Response> response;  // empty: the stream ended with `status`
    grpc::Status status;
  };
  using Rpc = grpc::ClientAsyncReaderWriter<Request, Response>;

  template <class PrepareFn>
  void start(PrepareFn prepare) {
    std::lock_guard lock(mutex_);
    rpc_ = prepare(&context_, completion_queue());
    rpc_->StartCall(on_completion([self = this->shared_from_this()](bool ok) { self->started(ok); }));
  }

  void write(Request request) {
    std::lock_guard lock(mutex_);
    if (ending_) return;
    pending_.push_back(std::move(request));
    write_next();
  }

  void cancel() { context_.TryCancel(); }

  awaitable<Item> next() { co_return co_await items_.async_pop(); }

 private:
  void started(bool ok) {
    std::lock_guard lock(mutex_);
    if (!ok) return finish();
    started_ = true;
    read_next();
    write_next();
  }

  // Called with the mutex held, as are the others that touch `rpc_` below.
  void read_next() {
    rpc_->Read(&response_, on_completion([self = this->shared_from_this()](bool ok) { self->read(ok); }));
  }

  void read(bool ok) {
    std::lock_guard lock(mutex_);
    if (!ok) return finish();
    items_.push(Item{std::move(response_), grpc::Status::OK});
    response_.Clear();
    read_next();
  }

  void write_next() {
    if (!started_ || writing_ || ending_ || pending_.empty()) return;
    writing_ = true;
    rpc_->Write(pending_.front(), on_completion([self = this->shared_from_this()](bool ok) { self->written(ok); }));
  }

  void written(bool ok) {
    std::lock_guard lock(mutex_);
    writing_ = false;
    pending_.pop_front();
    if (ok) write_next();  // else the read fails too, and finishes the stream
  }

  // A failed start or read means the stream is over: gRPC gives its status once asked.
  void finish() {
    ending_ = true;
    rpc_->Finish(&status_, on_completion([self = this->shared_from_this()](bool) {
      self->items_.push(Item{std::nullopt, self->status_});
    }));
  }

  grpc::ClientContext context_;
  std::unique_ptr<Rpc> rpc_;
  Response response_;
  grpc::Status status_;
  AsyncQueue<Item> items_;
  std::mutex mutex_;
  std::deque<Request> pending_;  // deque: Write keeps a pointer to the front until it completes
  bool started_ = false;
  bool writing_ = false;
  bool ending_ = false;
};

using WatchStream = BidiStream<pb::WatchRequest, pb::WatchResponse>;
using KeepAliveStream = BidiStream<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>;

class GrpcWatch final : public EtcdWatch {
 public:
  explicit GrpcWatch(std::shared_ptr<WatchStream> stream) : stream_(std::move(stream)) {}
  ~GrpcWatch() override { stream_->cancel(); }

  awaitable<WatchBatch> next() override {
    WatchBatch batch;
    if (ended_) {
      batch.error = errc::cancelled;
      co_return batch;
    }
    WatchStream::Item item = co_await stream_->next();
    if (!item.response) {
      ended_ = true;
      batch.error = item.status.ok() ? error_code(errc::cancelled) : from_status(item.status);
      if (batch.error == errc::cancelled) batch.canceled = true;
      co_return batch;
    }
    const pb::WatchResponse& resp = *item.response;
    watch_id_ = resp.watch_id();
    batch.revision = resp.header().revision();
    batch.compact_revision = resp.compact_revision();
    batch.created = resp.created();
    batch.canceled = resp.canceled();
    batch.cancel_reason = resp.cancel_reason();
    batch.events.reserve(resp.events_size());
    for (const auto& event : resp.events()) {
      WatchEvent out;
      out.type = event.type() == mvccpb::Event::DELETE ? WatchEvent::Type::erase : WatchEvent::Type::put;
      out.kv = from_pb(event.kv());
      if (event.has_prev_kv()) out.prev = from_pb(event.prev_kv());
      batch.events.push_back(std::move(out));
    }
    // etcd keeps the stream open after a cancel; end it so the reactor can finish.
    if (batch.canceled) stream_->cancel();
    co_return batch;
  }

  void cancel() override {
    pb::WatchRequest request;
    request.mutable_cancel_request()->set_watch_id(watch_id_);
    stream_->write(std::move(request));
  }

  void abort() override { stream_->cancel(); }

 private:
  std::shared_ptr<WatchStream> stream_;
  int64_t watch_id_ = 0;
  bool ended_ = false;
};

class GrpcLeaseKeeper final : public EtcdLeaseKeeper {
 public:
  GrpcLeaseKeeper(std::shared_ptr<KeepAliveStream> stream, int64_t lease)
      : stream_(std::move(stream)), lease_(lease) {}
  ~GrpcLeaseKeeper() override { stream_->cancel(); }

  awaitable<result<int64_t>> ping() override {
    if (ended_) co_return errc::etcd_unavailable;
    pb::LeaseKeepAliveRequest request;
    request.set_id(lease_);
    stream_->write(std::move(request));
    KeepAliveStream::Item item = co_await stream_->next();
    if (!item.response) {
      ended_ = true;
      co_return item.status.ok() ? error_code(errc::etcd_unavailable) : from_status(item.status);
    }
    co_return item.response->ttl();
  }

 private:
  std::shared_ptr<KeepAliveStream> stream_;
  int64_t lease_;
  bool ended_ = false;
};

// etcd's channel as the configuration asks: members, TLS, keepalive.
std::shared_ptr<grpc::Channel> make_channel(const EtcdConfig& config) {
  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("pick_first");
  args.SetMaxReceiveMessageSize(256 << 20);
  if (config.keepalive) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  }
  // toyvm retries every step itself. gRPC 1.51's own retry layer aborts the process on a
  // call that ends without a grpc-status (etcd over TLS answers so while it shuts down;
  // grpc/grpc#34683); without that layer such a call fails like any other.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2'000);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (uses_tls(config)) {
    // The files were checked when the configuration was loaded.
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = read_text_file(config.ca_file);  // empty: gRPC's default roots
    tls.pem_cert_chain = read_text_file(config.cert_file);
    tls.pem_private_key = read_text_file(config.key_file);
    credentials = grpc::SslCredentials(tls);
    // The members are dialled by address: their certificates are checked against the
    // configured name, else the first member's name.
    std::string name = config.server_name;
    if (name.empty()) {
      HostPort first = split_endpoint(config.endpoints.front());
      if (!is_ip_address(first.host)) name = first.host;
    }
    if (!name.empty()) args.SetSslTargetNameOverride(name);
  }
  return grpc::CreateCustomChannel(grpc_target(config.endpoints), credentials, args);
}

class GrpcEtcdClient final : public EtcdClient {
 public:
  explicit GrpcEtcdClient(const EtcdConfig& config)
      : endpoints_text_(fmt::format("{}", fmt::join(config.endpoints, ","))),
        timeout_(std::chrono::milliseconds(int64_t(config.timeout_s * 1000))),
        config_(config) {}

  // gRPC 1.51 can abort on an internal refcount assertion when a channel is torn down while
  // its own threads still work on it (seen at the exit of short commands). A process has one
  // channel per client and few clients, so the channel stays until the process ends.
  ~GrpcEtcdClient() override { new std::shared_ptr<grpc::Channel>(std::move(stubs_.channel)); }

  const std::string& endpoints_text() const override { return endpoints_text_; }

  std::string last_error() const override {
    std::lock_guard lock(error_mutex_);
    return last_error_;
  }

  awaitable<result<RangeResult>> range(std::string key, std::string range_end,
                                       int64_t revision) override {
    pb::RangeRequest request;
    request.set_key(std::move(key));
    request.set_range_end(std::move(range_end));
    request.set_revision(revision);
    auto start = [kv = stubs().kv.get()](auto* ctx, const auto& req, auto* queue) {
      return kv->PrepareAsyncRange(ctx, req, queue);
    };
    auto response = co_await unary<pb::RangeResponse>(std::move(request), start);
    if (!response) co_return response.error();
    co_return from_pb(*response);
  }

  awaitable<result<int64_t>> put(std::string key, std::string value, int64_t lease) override {
    pb::PutRequest request;
    request.set_key(std::move(key));
    request.set_value(std::move(value));
    request.set_lease(lease);
    auto start = [kv = stubs().kv.get()](auto* ctx, const auto& req, auto* queue) {
      return kv->PrepareAsyncPut(ctx, req, queue);
    };
    auto response = co_await unary<pb::PutResponse>(std::move(request), start);
    if (!response) co_return response.error();
    co_return response->header().revision();
  }

  awaitable<result<int64_t>> erase(std::string key, std::string range_end) override {
    pb::DeleteRangeRequest request;
    request.set_key(std::move(key));
    request.set_range_end(std::move(range_end));
    auto start = [kv = stubs().kv.get()](auto* ctx, const auto& req, auto* queue) {
      return kv->PrepareAsyncDeleteRange(ctx, req, queue);
    };
    auto response = co_await unary<pb::DeleteRangeResponse>(std::move(request), start);
    if (!response) co_return response.error();
    co_return response->deleted();
  }

  awaitable<result<TxnResult>> txn(std::vector<EtcdCompare> compare, std::vector<EtcdOp> success,
                                   std::vector<EtcdOp> failure) override {
    pb::TxnRequest request;
    for (const auto& cmp : compare) to_pb(cmp, *request.add_compare());
    for (const auto& op : success) to_pb(op, *request.add_success());
    for (const auto& op : failure) to_pb(op, *request.add_failure());
    auto start = [kv = stubs().kv.get()](auto* ctx, const auto& req, auto* queue) {
      return kv->PrepareAsyncTxn(ctx, req, queue);
    };
    auto response = co_await unary<pb::TxnResponse>(std::move(request), start);
    if (!response) co_return response.error();
    TxnResult out;
    out.succeeded = response->succeeded();
    out.revision = response->header().revision();
    for (const auto& op : response->responses()) {
      if (op.has_response_range()) out.ranges.push_back(from_pb(op.response_range()));
    }
    co_return out;
  }

  awaitable<result<int64_t>> lease_grant(int64_t ttl_seconds) override {
    pb::LeaseGrantRequest request;
    request.set_ttl(ttl_seconds);
    auto start = [lease = stubs().lease.get()](auto* ctx, const auto& req, auto* queue) {
      return lease->PrepareAsyncLeaseGrant(ctx, req, queue);
    };
    auto response = co_await unary<pb::LeaseGrantResponse>(std::move(request), start);
    if (!response) co_return response.error();
    if (!response->error().empty()) co_return errc::etcd_error;
    co_return response->id();
  }

  awaitable<result<void>> lease_revoke(int64_t id) override {
    pb::LeaseRevokeRequest request;
    request.set_id(id);
    auto start = [lease = stubs().lease.get()](auto* ctx, const auto& req, auto* queue) {
      return lease->PrepareAsyncLeaseRevoke(ctx, req, queue);
    };
    auto response = co_await unary<pb::LeaseRevokeResponse>(std::move(request), start);
    if (!response) co_return response.error();
    co_return result<void>{};
  }

  std::unique_ptr<EtcdLeaseKeeper> keep_alive(int64_t id) override {
    auto stream = std::make_shared<KeepAliveStream>();
    stream->start([lease = stubs().lease.get(), token = token_](auto* ctx, auto* queue) {
      if (!token.empty()) ctx->AddMetadata("token", token);
      ctx->AddMetadata("hasleader", "true");  // as for watches
      return lease->PrepareAsyncLeaseKeepAlive(ctx, queue);
    });
    return std::make_unique<GrpcLeaseKeeper>(std::move(stream), id);
  }

  std::unique_ptr<EtcdWatch> watch(WatchOptions options) override {
    auto stream = std::make_shared<WatchStream>();
    pb::WatchRequest request;
    auto* create = request.mutable_create_request();
    create->set_key(options.key);
    create->set_range_end(options.range_end);
    create->set_start_revision(options.start_revision);
    create->set_prev_kv(options.prev_kv);
    stream->start([watch = stubs().watch.get(), token = token_](auto* ctx, auto* queue) {
      if (!token.empty()) ctx->AddMetadata("token", token);
      // A member cut off from its cluster ends the watch instead of keeping it silently.
      ctx->AddMetadata("hasleader", "true");
      return watch->PrepareAsyncWatch(ctx, queue);
    });
    stream->write(std::move(request));
    return std::make_unique<GrpcWatch>(std::move(stream));
  }

 private:
  // One unary call: gRPC completes it on the completion thread, the queue resumes us on
  // ours. With etcd auth, a token is fetched first, and fetched again once if etcd says it
  // expired.
  template <class Response, class Request, class StartFn>
  awaitable<result<Response>> unary(Request request, StartFn start) {
    for (int attempt = 0;; ++attempt) {
      if (!config_.user.empty() && token_.empty()) {
        if (auto authenticated = co_await authenticate(); !authenticated) co_return authenticated.error();
      }
      auto [status, response] = co_await call<Response>(request, start, token_);
      if (status.ok()) co_return std::move(response);
      if (!config_.user.empty() && attempt == 0 && status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        spdlog::info("etcd: {}; authenticating again", status.error_message());
        token_.clear();
        continue;
      }
      remember(status);
      co_return from_status(status);
    }
  }

  template <class Response, class Request, class StartFn>
  awaitable<std::pair<grpc::Status, Response>> call(const Request& request, StartFn& start, const std::string& token) {
    struct Call {
      grpc::ClientContext context;
      std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> rpc;  // gRPC uses it until Finish is done
      Response response;
      grpc::Status status;
      AsyncQueue<bool> done;
    };
    auto call = std::make_shared<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() + timeout_);
    if (!token.empty()) call->context.AddMetadata("token", token);
    const auto started = std::chrono::steady_clock::now();
    call->rpc = start(&call->context, request, completion_queue());  // the request is serialized here
    call->rpc->StartCall();
    call->rpc->Finish(&call->response, &call->status, on_completion([call](bool) { call->done.push(true); }));
    co_await call->done.async_pop();
    grpc::Status status = std::move(call->status);
    metrics::observe("toyvm_etcd_request_seconds",
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    metrics::count("toyvm_etcd_requests_total", {{"code", status_name(status.error_code())}});
    co_return std::pair{std::move(status), std::move(call->response)};
  }

  awaitable<result<void>> authenticate() {
    pb::AuthenticateRequest request;
    request.set_name(config_.user);
    request.set_password(config_.password);
    auto start = [auth = stubs().auth.get()](auto* ctx, const auto& req, auto* queue) {
      return auth->PrepareAsyncAuthenticate(ctx, req, queue);
    };
    auto [status, response] = co_await call<pb::AuthenticateResponse>(request, start, "");
    if (!status.ok()) {
      remember(status, "authenticating as " + config_.user);
      co_return status.error_code() == grpc::StatusCode::UNAVAILABLE ? errc::etcd_unavailable : errc::etcd_error;
    }
    token_ = response.token();
    co_return result<void>{};
  }

  void remember(const grpc::Status& status, const std::string& doing = {}) {
    spdlog::debug("etcd {}: {}", endpoints_text_, status.error_message());
    std::lock_guard lock(error_mutex_);
    last_error_ = doing.empty() ? status.error_message() : doing + ": " + status.error_message();
  }

  std::string endpoints_text_;
  std::chrono::milliseconds timeout_;
  std::string token_;  // from Authenticate; used and renewed on the event loop's thread
  mutable std::mutex error_mutex_;
  std::string last_error_;
  // The channel is made at the first call, not with the client: gRPC's start (its library,
  // its threads, the connection) then overlaps what a command asks of Placement first.
  struct Stubs {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Watch::Stub> watch;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Auth::Stub> auth;
  };
  Stubs& stubs() {
    std::call_once(made_, [this] {
      stubs_.channel = make_channel(config_);
      stubs_.kv = pb::KV::NewStub(stubs_.channel);
      stubs_.watch = pb::Watch::NewStub(stubs_.channel);
      stubs_.lease = pb::Lease::NewStub(stubs_.channel);
      stubs_.auth = pb::Auth::NewStub(stubs_.channel);
    });
    return stubs_;
  }
  EtcdConfig config_;
  std::once_flag made_;
  Stubs stubs_;
};

}  // namespace

awaitable<result<RangeResult>> EtcdClient::range_prefix(std::string prefix) {
  std::string end = prefix_range_end(prefix);
  co_return co_await range(std::move(prefix), std::move(end));
}

awaitable<void> follow_range(EtcdClient& etcd, std::string key, std::string range_end,
                             std::function<void(const RangeResult&)> listed,
                             std::function<void(const WatchEvent&)> changed, std::function<bool()> stopping) {
  Backoff backoff;
  while (!stopping()) {
    auto listing = co_await etcd.range(key, range_end);
    if (listing) {
      listed(*listing);
      auto watch = etcd.watch(WatchOptions{key, range_end, listing->revision + 1, false});
      while (!stopping()) {
        WatchBatch batch = co_await watch->next();
        if (batch.error || batch.canceled || batch.compact_revision) break;
        backoff.reset();
        for (const WatchEvent& event : batch.events) changed(event);
      }
      if (!stopping()) {
        spdlog::warn("watch on {} ended; listing again", key);
        metrics::count("toyvm_etcd_watch_restarts_total");
      }
    } else {
      spdlog::warn("etcd at {}: {}; retrying", etcd.endpoints_text(), listing.error().message());
    }
    if (stopping()) break;
    co_await backoff.wait();
  }
}

awaitable<result<bool>> follow_key(EtcdClient& etcd, std::string key, int64_t revision,
                                   std::chrono::milliseconds timeout,
                                   std::function<bool(const WatchEvent&)> seen) {
  auto executor = co_await asio::this_coro::executor;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // The alarm's handler may run after this frame is gone (its wait completed just as the
  // frame returned), so what it touches is shared with it. It ends the watch at once: etcd
  // may be too far gone to answer a cancel request.
  struct Alarm {
    bool expired = false;
    std::unique_ptr<EtcdWatch> watch;
  };
  auto shared = std::make_shared<Alarm>();
  bool& expired = shared->expired;
  std::unique_ptr<EtcdWatch>& watch = shared->watch;
  asio::steady_timer alarm(executor, deadline);
  alarm.async_wait([shared](const error_code& ec) {
    if (ec) return;
    shared->expired = true;
    if (shared->watch) shared->watch->abort();
  });
  Backoff backoff(std::chrono::milliseconds(100), std::chrono::seconds(2));
  error_code unanswered;  // what etcd said last, while it did not answer
  bool warned = false;    // once per outage
  while (!expired) {
    if (revision == 0) {  // after a lost watch: where the key stands now
      auto now = co_await etcd.range(key);
      if (now) {
        unanswered = {};
        warned = false;
        WatchEvent event;
        if (now->kvs.empty()) {
          event.type = WatchEvent::Type::erase;
          event.kv.key = key;
        } else {
          event.kv = now->kvs.front();
        }
        if (seen(event)) co_return true;
        revision = now->revision + 1;
      } else {
        if (!std::exchange(warned, true))
          spdlog::warn("etcd at {}: {}; retrying", etcd.endpoints_text(), now.error().message());
        unanswered = now.error();
      }
    }
    if (revision != 0) {
      watch = etcd.watch(WatchOptions{key, {}, revision, false});
      while (!expired) {
        WatchBatch batch = co_await watch->next();
        if (expired) break;
        if (batch.error || batch.canceled || batch.compact_revision) {
          spdlog::debug("watch on {} ended ({}); reading it again", key,
                        batch.compact_revision ? "compacted" : batch.error ? batch.error.message() : batch.cancel_reason);
          metrics::count("toyvm_etcd_watch_restarts_total");
          if (batch.error) unanswered = batch.error;
          revision = 0;
          break;
        }
        backoff.reset();
        for (const WatchEvent& event : batch.events)
          if (seen(event)) co_return true;
      }
      watch.reset();
    }
    if (expired) break;
    co_await backoff.wait(deadline);
  }
  if (unanswered) co_return result<bool>(boost::system::in_place_error, unanswered);
  co_return false;
}

namespace {
// gRPC logs its own errors (a failed TLS handshake, say) to stderr; toyvm reports failures
// itself in one line, so gRPC's lines go to the debug log.
void forward_grpc_log(gpr_log_func_args* args) { spdlog::debug("grpc: {}", args->message); }
}  // namespace

std::shared_ptr<EtcdClient> EtcdClient::create(const EtcdConfig& config) {
  static std::once_flag once;
  std::call_once(once, [] {
    gpr_set_log_function(forward_grpc_log);
    // Debian builds abseil without NDEBUG, so every absl::Mutex that gRPC locks also updates a
    // global lock-order graph (3.5% of one `toyvm schedule`'s instructions, callgrind).
    // A release build of abseil does not track it; neither do we.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
  return std::make_shared<GrpcEtcdClient>(config);
}

}  // namespace toyvm
