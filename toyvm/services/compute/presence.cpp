#include "services/compute/presence.hpp"

#include "model/host_stats.hpp"

#include <boost/asio/as_tuple.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace toyvm::compute {

using namespace std::chrono_literals;

bool HostPresence::full() const {
  int limit = ctx_.config.compute.max_instances;
  return limit > 0 && instance_count() >= size_t(limit);
}

size_t HostPresence::instance_count() const {
  size_t n = 0;
  for (auto& [uuid, slot] : slots_)
    if (slot.desired && slot.desired->power != PowerState::deleted) ++n;
  return n;
}

HostRecord HostPresence::host_record() const {
  HostRecord record;
  record.name = ctx_.host.name;
  record.provider = ctx_.host.provider;
  record.capacity = capacity_;
  record.agent_version = TOYVM_VERSION;
  record.started_at = started_at_;
  record.domains = domain_count_;
  record.status = maintenance_ ? "DISABLED" : full() ? "FULL" : "READY";
  return record;
}

awaitable<void> HostPresence::announce() {
  std::chrono::milliseconds delay = 100ms;
  while (!ctx_.stopping) {
    auto lease = co_await ctx_.etcd->lease_grant(ctx_.config.compute.lease_ttl_s);
    if (lease) {
      std::vector<EtcdOp> puts{EtcdOp::put(ctx_.keys.host(ctx_.host.provider), encode(host_record()), *lease)};
      if (stats_) puts.push_back(EtcdOp::put(ctx_.keys.stats(ctx_.host.provider), encode(*stats_), *lease));
      auto put = co_await ctx_.etcd->txn({}, std::move(puts));
      if (put) {
        lease_ = *lease;
        domains_published_.reset();  // a new lease: put the list again under it
        co_return;
      }
    }
    spdlog::warn("announcing host in etcd at {}: unavailable; retrying", ctx_.etcd->endpoints_text());
    co_await backoff(ctx_.io, delay);
  }
}

awaitable<void> HostPresence::keep_alive() {
  asio::steady_timer timer(ctx_.io);
  auto interval = std::chrono::milliseconds(ctx_.config.compute.lease_ttl_s * 1000 / 3);
  while (!ctx_.stopping) {
    auto keeper = ctx_.etcd->keep_alive(lease_);
    while (!ctx_.stopping) {
      auto ttl = co_await keeper->ping();
      if (!ttl || *ttl <= 0) break;
      timer.expires_after(interval);
      co_await timer.async_wait(asio::as_tuple(use_awaitable));
    }
    if (ctx_.stopping) break;
    spdlog::warn("lost the etcd lease; announcing the host again");
    co_await announce();
  }
}

void HostPresence::publish() {
  dirty_ = true;
  if (publishing_ || !lease_) return;
  publishing_ = true;
  spawn_detached(ctx_.io, publish_loop(), "publishing the host record");
}

awaitable<void> HostPresence::publish_loop() {
  asio::steady_timer settle(ctx_.io);
  while (dirty_ && !ctx_.stopping) {
    // Changes that come in a burst (a batch being built) are published together.
    settle.expires_after(200ms);
    co_await settle.async_wait(asio::as_tuple(use_awaitable));
    dirty_ = false;
    auto domains = co_await ctx_.virt(&VirtBackend::list);
    std::vector<EtcdOp> puts;
    if (domains) {
      domain_count_ = int64_t(domains.value.size());
      std::sort(domains.value.begin(), domains.value.end());
      if (domains_published_ != domains.value)
        puts.push_back(EtcdOp::put(ctx_.keys.domains(ctx_.host.provider), encode_domains(domains.value), lease_));
    }
    puts.push_back(EtcdOp::put(ctx_.keys.host(ctx_.host.provider), encode(host_record()), lease_));
    auto written = co_await ctx_.etcd->txn({}, std::move(puts));
    if (written && domains) domains_published_ = std::move(domains.value);
  }
  publishing_ = false;
}

awaitable<void> HostPresence::report_stats() {
  asio::steady_timer timer(ctx_.io);
  const auto interval = std::chrono::milliseconds(int64_t(ctx_.config.compute.stats_interval_s * 1000));
  while (!ctx_.stopping) {
    auto stats = measure_host_stats(ctx_.host.instance_dir);
    if (stats) {
      stats_ = *stats;
      if (lease_) co_await ctx_.etcd->put(ctx_.keys.stats(ctx_.host.provider), encode(*stats), lease_);
    } else {
      spdlog::warn("cannot measure this host's memory, disk and load");
    }
    ++ctx_.activity;
    timer.expires_after(interval);
    co_await timer.async_wait(asio::as_tuple(use_awaitable));
  }
}

awaitable<void> HostPresence::revoke() {
  if (lease_) co_await ctx_.etcd->lease_revoke(lease_);
}

}  // namespace toyvm::compute
