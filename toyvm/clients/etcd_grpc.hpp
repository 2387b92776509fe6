#pragma once
// What the parts of the etcd client share beneath clients/etcd.hpp: how a gRPC operation
// completes (one completion queue for the process, its outcome handed to the event loop),
// streams read by one coroutine, and the channel made from the configuration. Only the
// clients/etcd*.cpp files include it: it brings in gRPC and the generated etcd API.

#include "clients/etcd.hpp"
#include "core/async.hpp"
#include "rpc.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace toyvm::etcd_grpc {

namespace pb = etcdserverpb;

// The code, and what etcd or gRPC said (TLS, auth...) as the detail.
Error from_status(const grpc::Status& status);
// For metrics: the few outcomes worth telling apart.
std::string status_name(grpc::StatusCode code);

KeyValue from_pb(const mvccpb::KeyValue& kv);

// etcd's channel as the configuration asks: members, TLS, keepalive.
std::shared_ptr<grpc::Channel> make_channel(const EtcdConfig& config);

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

inline Completion* on_completion(std::function<void(bool ok)> fn) { return new Completion(std::move(fn)); }

grpc::CompletionQueue* completion_queue();

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

  // Items handed to `sink` on gRPC's thread as they come, instead of queued for next(); set
  // before start. (Called with no lock of the stream's held: it may write.)
  void set_sink(std::function<void(Item)> sink) { sink_ = std::move(sink); }

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
    std::unique_lock lock(mutex_);
    if (!ok) return finish();
    Item item{std::move(response_), grpc::Status::OK};
    response_.Clear();
    read_next();
    lock.unlock();
    deliver(std::move(item));
  }

  void deliver(Item item) {
    if (sink_) sink_(std::move(item));
    else items_.push(std::move(item));
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
      self->deliver(Item{std::nullopt, self->status_});
    }));
  }

  grpc::ClientContext context_;
  std::unique_ptr<Rpc> rpc_;
  Response response_;
  grpc::Status status_;
  AsyncQueue<Item> items_;
  std::function<void(Item)> sink_;
  std::mutex mutex_;
  std::deque<Request> pending_;  // deque: Write keeps a pointer to the front until it completes
  bool started_ = false;
  bool writing_ = false;
  bool ending_ = false;
};

// The streaming calls (clients/etcd_streams.cpp), each under the auth token when there is one.
class WatchMux;
class KeepAliveMux;

// A client's multiplexed stream of one kind: a new one once the last ended (everything on it
// then ends with its error, and its owners ask again, as after any lost stream) or the stub or
// the auth token changed. `Mux::open(stub, token)` starts one (clients/etcd_streams.cpp).
template <class Mux, class Stub>
class SharedStream {
 public:
  template <class... More>
  std::shared_ptr<Mux> current(Stub& stub, const std::string& token, const More&... more) {
    std::lock_guard lock(mutex_);
    if (!mux_ || mux_->ended() || stub_ != &stub || token_ != token) {
      mux_ = Mux::open(stub, token, more...);
      stub_ = &stub;
      token_ = token;
    }
    return mux_;
  }

 private:
  std::mutex mutex_;
  std::shared_ptr<Mux> mux_;
  Stub* stub_ = nullptr;
  std::string token_;
};

// A client's watches, on one gRPC stream as etcd's own client keeps them (a watch id each):
// ten thousand simulated hosts are one stream to etcd, not fifty thousand.
class WatchStreams {
 public:
  std::unique_ptr<EtcdWatch> open(pb::Watch::Stub& stub, const std::string& token, const WatchOptions& options);

 private:
  SharedStream<WatchMux, pb::Watch::Stub> stream_;
};

// What a client's keep-alive streams have heard, on gRPC's thread: the newest raft term an
// answer carried (a new one: the cluster elected a leader), and how many streams ended in an error.
struct RenewalNews {
  std::atomic<uint64_t> term{0};
  std::atomic<uint64_t> failures{0};
};

// A client's lease keep-alives, on gRPC streams shared by its leases (etcd answers each with
// its lease id), a lease always in the same slot. Not one stream for all: etcd renews a stream's
// leases one after another, each once the leader has applied what it had committed (through
// the leader when the stream is a follower's). The ten thousand leases of a process of
// simulated hosts, renewed every 14 s (a TTL of 30), are 700 renewals a second: on one stream
// they fall behind, and lapse, once a renewal takes 1.4 ms; on 256, a third of a second.
// Where a slot's stream goes is the client's `route`, asked again before each renewal, so that
// a lease kept alive follows the client's choice of member (see GrpcEtcdClient's leader).
class KeepAliveStreams : public std::enable_shared_from_this<KeepAliveStreams> {
 public:
  static constexpr size_t streams = 256;
  struct Way {
    pb::Lease::Stub* stub;
    std::string token;
  };
  // `executor`: where the client may start looking for a better way; empty: not now.
  using Route = std::function<Way(const asio::any_io_executor& executor)>;
  explicit KeepAliveStreams(Route route) : route_(std::move(route)) {}

  std::unique_ptr<EtcdLeaseKeeper> open(int64_t lease, const asio::any_io_executor& executor);
  // The stream `lease`'s renewals go on now.
  std::shared_ptr<KeepAliveMux> current(int64_t lease, const asio::any_io_executor& executor);
  const RenewalNews& news() const { return *news_; }

 private:
  Route route_;
  std::shared_ptr<RenewalNews> news_ = std::make_shared<RenewalNews>();
  std::array<SharedStream<KeepAliveMux, pb::Lease::Stub>, streams> streams_;
};

}  // namespace toyvm::etcd_grpc
