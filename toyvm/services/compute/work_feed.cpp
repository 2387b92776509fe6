#include "services/compute/work_feed.hpp"

#include "core/failpoint.hpp"
#include "core/metrics.hpp"

#include <spdlog/spdlog.h>

namespace toyvm::compute {

awaitable<result<void>> KeyFeed::list() {
  auto listed = co_await ctx_.etcd->range_prefix(prefix_);
  if (!listed) co_return listed.error();
  listed_ = listed->revision;
  known_.take(*listed);
  co_await handlers_.listed(std::move(*listed));
  co_return result<void>{};
}

awaitable<void> KeyFeed::load() {
  Backoff backoff;
  while (!ctx_.stop.requested()) {
    auto listed = co_await list();
    if (listed) co_return;
    spdlog::warn("listing {} in etcd: {}; retrying", prefix_, listed.error().message());
    co_await backoff.wait();
  }
}

awaitable<void> KeyFeed::follow() {
  Backoff backoff;
  while (!ctx_.stop.requested()) {
    if (!listed_) {
      if (auto listed = co_await list(); !listed) {
        spdlog::warn("listing {} in etcd: {}; retrying", prefix_, listed.error().message());
        co_await backoff.wait();
        continue;
      }
    }
    const int64_t revision = *std::exchange(listed_, std::nullopt);
    watch_ = ctx_.etcd->watch(WatchOptions{prefix_, prefix_range_end(prefix_), revision + 1, false});
    while (!ctx_.stop.requested()) {
      WatchBatch batch = co_await watch_->next();
      if (batch.error.code || batch.canceled || batch.compact_revision) {
        if (!ctx_.stop.requested()) {
          spdlog::warn("watch on {} ended ({}); listing again", prefix_,
                       batch.compact_revision ? "compacted" : batch.error.message());
          metrics::count("toyvm_etcd_watch_restarts_total");
        }
        break;
      }
      backoff.reset();
      co_await failpoint::pass("feed.batch");
      for (WatchEvent& event : batch.events) {
        known_.take(event);
        handlers_.changed(event);
      }
    }
    watch_.reset();
    if (!ctx_.stop.requested()) co_await backoff.wait();
  }
}

awaitable<void> KeyFeed::resync_periodically() {
  const auto interval = ctx_.config.compute.resync_interval;
  for (int round = 1;; ++round) {
    const bool slept = co_await ctx_.stop.sleep_on_grid(interval);
    if (!slept) co_return;
    if (round % 10 != 0 && known_.revision() > 0) {
      co_await handlers_.listed(known_.listing());
      continue;
    }
    auto listed = co_await ctx_.etcd->range_prefix(prefix_);
    if (!listed) continue;
    known_.take(*listed);
    co_await handlers_.listed(std::move(*listed));
  }
}

void KeyFeed::stop() {
  if (watch_) watch_->cancel();
}

}  // namespace toyvm::compute
