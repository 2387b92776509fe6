// The etcd client's streams: watches and lease keep-alives, each a bidirectional gRPC stream
// read by one coroutine.

#include "clients/etcd_grpc.hpp"

namespace toyvm::etcd_grpc {
namespace {

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
      batch.error = item.status.ok() ? Error(errc::cancelled) : from_status(item.status);
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
      co_return item.status.ok() ? Error(errc::etcd_unavailable, "the keep-alive stream ended")
                                 : from_status(item.status);
    }
    co_return item.response->ttl();
  }

 private:
  std::shared_ptr<KeepAliveStream> stream_;
  int64_t lease_;
  bool ended_ = false;
};

}  // namespace

std::unique_ptr<EtcdWatch> open_watch(pb::Watch::Stub& stub, const std::string& token, const WatchOptions& options) {
  auto stream = std::make_shared<WatchStream>();
  pb::WatchRequest request;
  auto* create = request.mutable_create_request();
  create->set_key(options.key);
  create->set_range_end(options.range_end);
  create->set_start_revision(options.start_revision);
  create->set_prev_kv(options.prev_kv);
  stream->start([watch = &stub, token](auto* ctx, auto* queue) {
    if (!token.empty()) ctx->AddMetadata("token", token);
    // A member cut off from its cluster ends the watch instead of keeping it silently.
    ctx->AddMetadata("hasleader", "true");
    return watch->PrepareAsyncWatch(ctx, queue);
  });
  stream->write(std::move(request));
  return std::make_unique<GrpcWatch>(std::move(stream));
}

std::unique_ptr<EtcdLeaseKeeper> open_keep_alive(pb::Lease::Stub& stub, const std::string& token, int64_t lease) {
  auto stream = std::make_shared<KeepAliveStream>();
  stream->start([keeper = &stub, token](auto* ctx, auto* queue) {
    if (!token.empty()) ctx->AddMetadata("token", token);
    ctx->AddMetadata("hasleader", "true");  // as for watches
    return keeper->PrepareAsyncLeaseKeepAlive(ctx, queue);
  });
  return std::make_unique<GrpcLeaseKeeper>(std::move(stream), lease);
}

}  // namespace toyvm::etcd_grpc
