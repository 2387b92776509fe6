// Riding over etcd's changes and outages: follow_range (a listing, then its changes),
// follow_key (one key until a condition holds) and txn_asking_again. Built on EtcdClient alone.

#include "clients/etcd.hpp"

#include "core/backoff.hpp"
#include "core/metrics.hpp"

#include <spdlog/spdlog.h>

#include <utility>

namespace toyvm {

awaitable<result<TxnResult>> txn_asking_again(EtcdClient& etcd, std::vector<EtcdCompare> compare,
                                              std::vector<EtcdOp> success, std::chrono::milliseconds patience) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  Backoff backoff(std::chrono::milliseconds(50), std::chrono::seconds(1));
  for (;;) {
    auto done = co_await etcd.txn(compare, success);
    if (done || done.error() != errc::etcd_unavailable || std::chrono::steady_clock::now() >= deadline) co_return done;
    spdlog::debug("etcd at {}: {}; asking again", etcd.endpoints_text(), done.error().message());
    co_await backoff.wait(deadline);
  }
}

awaitable<void> follow_range(EtcdClient& etcd, std::string key, std::string range_end,
                             std::function<void(const RangeResult&)> listed,
                             std::function<void(const WatchEvent&)> changed, std::function<bool()> stopping,
                             int64_t listed_revision) {
  Backoff backoff;
  while (!stopping()) {
    if (listed_revision == 0) {
      auto listing = co_await etcd.range(key, range_end);
      if (!listing) {
        spdlog::warn("etcd at {}: {}; retrying", etcd.endpoints_text(), listing.error().message());
        if (stopping()) break;
        co_await backoff.wait();
        continue;
      }
      listed(*listing);
      listed_revision = listing->revision;
    }
    auto watch = etcd.watch(WatchOptions{key, range_end, std::exchange(listed_revision, 0) + 1, false});
    while (!stopping()) {
      WatchBatch batch = co_await watch->next();
      if (batch.error.code || batch.canceled || batch.compact_revision) break;
      backoff.reset();
      for (const WatchEvent& event : batch.events) changed(event);
    }
    if (stopping()) break;
    spdlog::warn("watch on {} ended; listing again", key);
    metrics::count("toyvm_etcd_watch_restarts_total");
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
  Error unanswered;       // what etcd said last, while it did not answer
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
        if (batch.error.code || batch.canceled || batch.compact_revision) {
          spdlog::debug("watch on {} ended ({}); reading it again", key,
                        batch.compact_revision ? "compacted" : batch.error.code ? batch.error.message() : batch.cancel_reason);
          metrics::count("toyvm_etcd_watch_restarts_total");
          if (batch.error.code) unanswered = batch.error;
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
  if (unanswered.code) co_return result<bool>(boost::system::in_place_error, unanswered);
  co_return false;
}

}  // namespace toyvm
