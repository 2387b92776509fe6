#include "services/compute/work_feed.hpp"

#include "core/failpoint.hpp"
#include "core/metrics.hpp"

#include <spdlog/spdlog.h>

namespace toyvm::compute {

awaitable<void> WorkFeed::follow() {
  Backoff backoff;
  const std::string prefix = ctx_.keys.work_prefix(ctx_.host.provider);
  while (!ctx_.stop.requested()) {
    auto listed = co_await ctx_.etcd->range_prefix(prefix);
    if (!listed) {
      spdlog::warn("listing {} in etcd: {}; retrying", prefix, listed.error().message());
      co_await backoff.wait();
      continue;
    }
    const int64_t revision = listed->revision;
    co_await instances_.apply_listing(std::move(*listed));
    watch_ = ctx_.etcd->watch(WatchOptions{prefix, prefix_range_end(prefix), revision + 1, false});
    while (!ctx_.stop.requested()) {
      WatchBatch batch = co_await watch_->next();
      if (batch.error.code || batch.canceled || batch.compact_revision) {
        if (!ctx_.stop.requested()) {
          spdlog::warn("watch on {} ended ({}); listing again", prefix,
                       batch.compact_revision ? "compacted" : batch.error.message());
          metrics::count("toyvm_etcd_watch_restarts_total");
        }
        break;
      }
      backoff.reset();
      co_await failpoint::pass("feed.batch");
      for (WatchEvent& event : batch.events) instances_.apply(event);
    }
    watch_.reset();
    if (!ctx_.stop.requested()) co_await backoff.wait();
  }
}

awaitable<void> WorkFeed::resync_periodically() {
  const auto interval = ctx_.config.compute.resync_interval;
  while (co_await ctx_.stop.sleep(interval)) {
    auto listed = co_await ctx_.etcd->range_prefix(ctx_.keys.work_prefix(ctx_.host.provider));
    if (listed) co_await instances_.apply_listing(std::move(*listed));
    ++ctx_.activity;
  }
}

void WorkFeed::stop() {
  if (watch_) watch_->cancel();
}

}  // namespace toyvm::compute
