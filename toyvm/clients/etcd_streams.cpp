// The etcd client's streams: its watches, all on one bidirectional gRPC stream, and its lease
// keep-alives, on streams of their own shared by its leases.

#include "clients/etcd_grpc.hpp"

#include <boost/asio/this_coro.hpp>

#include <deque>
#include <map>

namespace toyvm::etcd_grpc {
namespace {

using WatchStream = BidiStream<pb::WatchRequest, pb::WatchResponse>;
using KeepAliveStream = BidiStream<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>;

}  // namespace

// One watch stream and the watches on it. etcd answers the creates in the order they were
// asked, each with the id it gave the watch, and tags every later response with that id:
// responses are handed to their watch's queue on gRPC's thread, as they come.
class WatchMux final : public std::enable_shared_from_this<WatchMux> {
 public:
  struct Member {
    AsyncQueue<WatchBatch> batches;
    int64_t id = -1;         // etcd's, once created
    bool dropped = false;    // its owner is gone or aborted it: cancelled once created
    bool cancel_asked = false;  // asked before it was created: cancelled once it is
  };

  explicit WatchMux(std::shared_ptr<WatchStream> stream) : stream_(std::move(stream)) {}
  static std::shared_ptr<WatchMux> open(pb::Watch::Stub& stub, const std::string& token) {
    auto mux = std::make_shared<WatchMux>(std::make_shared<WatchStream>());
    mux->start(stub, token);
    return mux;
  }
  ~WatchMux() { stream_->cancel(); }  // none of its watches is left

  void start(pb::Watch::Stub& stub, const std::string& token) {
    stream_->set_sink([weak = weak_from_this()](WatchStream::Item item) {
      if (auto self = weak.lock()) self->dispatch(std::move(item));
    });
    stream_->start([watch = &stub, token](auto* ctx, auto* queue) {
      if (!token.empty()) ctx->AddMetadata("token", token);
      // A member cut off from its cluster ends the watches instead of keeping them silently.
      ctx->AddMetadata("hasleader", "true");
      return watch->PrepareAsyncWatch(ctx, queue);
    });
  }

  bool ended() {
    std::lock_guard lock(mutex_);
    return ended_;
  }

  std::shared_ptr<Member> add(const WatchOptions& options) {
    pb::WatchRequest request;
    auto* create = request.mutable_create_request();
    create->set_key(options.key);
    create->set_range_end(options.range_end);
    create->set_start_revision(options.start_revision);
    create->set_prev_kv(options.prev_kv);
    auto member = std::make_shared<Member>();
    std::lock_guard lock(mutex_);
    if (ended_) {
      member->batches.push(ended_batch_);
      return member;
    }
    creating_.push_back(member);
    stream_->write(std::move(request));
    return member;
  }

  // Asks etcd to cancel it; its answer comes as a canceled batch.
  void cancel(const std::shared_ptr<Member>& member) {
    std::lock_guard lock(mutex_);
    if (ended_) return;
    if (member->id >= 0) write_cancel(member->id);
    else member->cancel_asked = true;
  }

  // Its owner is done with it: nothing more is delivered, and etcd is asked to cancel it.
  void drop(const std::shared_ptr<Member>& member) {
    std::lock_guard lock(mutex_);
    member->dropped = true;
    if (member->id < 0 || ended_) return;  // still being created: cancelled once it is
    if (members_.erase(member->id)) write_cancel(member->id);
  }

 private:
  void write_cancel(int64_t id) {
    pb::WatchRequest request;
    request.mutable_cancel_request()->set_watch_id(id);
    stream_->write(std::move(request));
  }

  void dispatch(WatchStream::Item item) {
    std::lock_guard lock(mutex_);
    if (!item.response) {
      // The stream is over: every watch on it ends with its status.
      ended_ = true;
      ended_batch_.error = item.status.ok() ? Error(errc::cancelled) : from_status(item.status);
      if (ended_batch_.error == errc::cancelled) ended_batch_.canceled = true;
      for (auto& member : creating_) member->batches.push(ended_batch_);
      for (auto& [id, member] : members_) member->batches.push(ended_batch_);
      creating_.clear();
      members_.clear();
      return;
    }
    const pb::WatchResponse& resp = *item.response;
    std::shared_ptr<Member> member;
    if (resp.created()) {
      if (creating_.empty()) return;  // not one of ours: cannot happen
      member = creating_.front();
      creating_.pop_front();
      member->id = resp.watch_id();
      if (member->dropped) {
        if (!resp.canceled() && resp.watch_id() >= 0) write_cancel(resp.watch_id());
        return;
      }
      if (!resp.canceled()) {
        members_[resp.watch_id()] = member;
        if (member->cancel_asked) write_cancel(resp.watch_id());
      }
    } else {
      auto found = members_.find(resp.watch_id());
      if (found == members_.end()) return;  // cancelled meanwhile
      member = found->second;
      if (resp.canceled()) members_.erase(found);
    }
    member->batches.push(to_batch(resp));
  }

  static WatchBatch to_batch(const pb::WatchResponse& resp) {
    WatchBatch batch;
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
    return batch;
  }

  std::shared_ptr<WatchStream> stream_;
  std::mutex mutex_;
  std::deque<std::shared_ptr<Member>> creating_;   // asked, in order, not yet answered
  std::map<int64_t, std::shared_ptr<Member>> members_;
  bool ended_ = false;
  WatchBatch ended_batch_;  // what every watch on it sees once it ended
};

namespace {

class GrpcWatch final : public EtcdWatch {
 public:
  GrpcWatch(std::shared_ptr<WatchMux> mux, std::shared_ptr<WatchMux::Member> member)
      : mux_(std::move(mux)), member_(std::move(member)) {}
  ~GrpcWatch() override { mux_->drop(member_); }

  awaitable<WatchBatch> next() override {
    if (ended_) {
      WatchBatch batch;
      batch.error = errc::cancelled;
      co_return batch;
    }
    WatchBatch batch = co_await member_->batches.async_pop();
    if (batch.error.code || batch.canceled) ended_ = true;
    co_return batch;
  }

  void cancel() override { mux_->cancel(member_); }

  // Ends it here: next() sees an error (the one waiting now too), and etcd is asked to cancel it.
  void abort() override {
    mux_->drop(member_);
    WatchBatch aborted;
    aborted.error = errc::cancelled;
    member_->batches.push(std::move(aborted));
  }

 private:
  std::shared_ptr<WatchMux> mux_;
  std::shared_ptr<WatchMux::Member> member_;
  bool ended_ = false;
};

}  // namespace

// One keep-alive stream and the leases kept alive on it: each answer names its lease, and
// goes to the keepers of that lease waiting for one.
class KeepAliveMux final : public std::enable_shared_from_this<KeepAliveMux> {
 public:
  struct Member {
    int64_t lease = 0;
    AsyncQueue<result<int64_t>> answers;
    int waiting = 0;  // pings sent and not answered
  };

  KeepAliveMux(std::shared_ptr<KeepAliveStream> stream, std::shared_ptr<RenewalNews> news)
      : stream_(std::move(stream)), news_(std::move(news)) {}
  static std::shared_ptr<KeepAliveMux> open(pb::Lease::Stub& stub, const std::string& token,
                                            const std::shared_ptr<RenewalNews>& news) {
    auto mux = std::make_shared<KeepAliveMux>(std::make_shared<KeepAliveStream>(), news);
    mux->start(stub, token);
    return mux;
  }
  ~KeepAliveMux() { stream_->cancel(); }

  void start(pb::Lease::Stub& stub, const std::string& token) {
    stream_->set_sink([weak = weak_from_this()](KeepAliveStream::Item item) {
      if (auto self = weak.lock()) self->dispatch(std::move(item));
    });
    stream_->start([keeper = &stub, token](auto* ctx, auto* queue) {
      if (!token.empty()) ctx->AddMetadata("token", token);
      ctx->AddMetadata("hasleader", "true");  // as for watches
      return keeper->PrepareAsyncLeaseKeepAlive(ctx, queue);
    });
  }

  bool ended() {
    std::lock_guard lock(mutex_);
    return ended_.has_value();
  }

  std::shared_ptr<Member> add(int64_t lease) {
    auto member = std::make_shared<Member>();
    member->lease = lease;
    std::lock_guard lock(mutex_);
    members_.emplace(lease, member);
    return member;
  }

  void remove(const std::shared_ptr<Member>& member) {
    std::lock_guard lock(mutex_);
    auto [first, last] = members_.equal_range(member->lease);
    for (auto it = first; it != last; ++it)
      if (it->second == member) {
        members_.erase(it);
        break;
      }
  }

  void ping(const std::shared_ptr<Member>& member) {
    std::lock_guard lock(mutex_);
    if (ended_) {
      member->answers.push(*ended_);
      return;
    }
    ++member->waiting;
    pb::LeaseKeepAliveRequest request;
    request.set_id(member->lease);
    stream_->write(std::move(request));
  }

 private:
  void dispatch(KeepAliveStream::Item item) {
    std::lock_guard lock(mutex_);
    if (!item.response) {
      ended_ = item.status.ok() ? Error(errc::etcd_unavailable, "the keep-alive stream ended") : from_status(item.status);
      // A stream cancelled because nobody renews on it any more is no failure.
      if (item.status.error_code() != grpc::StatusCode::CANCELLED) ++news_->failures;
      for (auto& [lease, member] : members_)
        for (; member->waiting > 0; --member->waiting) member->answers.push(*ended_);
      return;
    }
    const uint64_t term = item.response->header().raft_term();
    for (uint64_t seen = news_->term; term > seen && !news_->term.compare_exchange_weak(seen, term);) {
    }
    auto [first, last] = members_.equal_range(item.response->id());
    for (auto it = first; it != last; ++it) {
      if (it->second->waiting == 0) continue;
      --it->second->waiting;
      it->second->answers.push(item.response->ttl());
    }
  }

  std::shared_ptr<KeepAliveStream> stream_;
  std::shared_ptr<RenewalNews> news_;
  std::mutex mutex_;
  std::multimap<int64_t, std::shared_ptr<Member>> members_;
  std::optional<Error> ended_;
};

namespace {

class GrpcLeaseKeeper final : public EtcdLeaseKeeper {
 public:
  GrpcLeaseKeeper(std::weak_ptr<KeepAliveStreams> streams, std::shared_ptr<KeepAliveMux> mux, int64_t lease)
      : streams_(std::move(streams)), lease_(lease), mux_(std::move(mux)), member_(mux_->add(lease)) {}
  ~GrpcLeaseKeeper() override { mux_->remove(member_); }

  awaitable<result<int64_t>> ping() override {
    if (ended_) co_return errc::etcd_unavailable;
    // Between renewals (none is awaited), onto the stream its client renews through now.
    const asio::any_io_executor executor = co_await asio::this_coro::executor;
    if (auto streams = streams_.lock()) {
      auto now = streams->current(lease_, executor);
      if (now != mux_) {
        mux_->remove(member_);
        mux_ = std::move(now);
        member_ = mux_->add(lease_);
      }
    }
    mux_->ping(member_);
    result<int64_t> ttl = co_await member_->answers.async_pop();
    if (!ttl) ended_ = true;
    co_return ttl;
  }

 private:
  std::weak_ptr<KeepAliveStreams> streams_;
  int64_t lease_;
  std::shared_ptr<KeepAliveMux> mux_;
  std::shared_ptr<KeepAliveMux::Member> member_;
  bool ended_ = false;
};

}  // namespace

std::unique_ptr<EtcdWatch> WatchStreams::open(pb::Watch::Stub& stub, const std::string& token,
                                               const WatchOptions& options) {
  std::shared_ptr<WatchMux> mux = stream_.current(stub, token);
  auto member = mux->add(options);
  return std::make_unique<GrpcWatch>(std::move(mux), std::move(member));
}

std::shared_ptr<KeepAliveMux> KeepAliveStreams::current(int64_t lease, const asio::any_io_executor& executor) {
  Way way = route_(executor);
  return streams_[uint64_t(lease) % streams].current(*way.stub, way.token, news_);
}

std::unique_ptr<EtcdLeaseKeeper> KeepAliveStreams::open(int64_t lease, const asio::any_io_executor& executor) {
  return std::make_unique<GrpcLeaseKeeper>(weak_from_this(), current(lease, executor), lease);
}

}  // namespace toyvm::etcd_grpc
