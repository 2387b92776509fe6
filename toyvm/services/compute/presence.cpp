#include "services/compute/presence.hpp"

#include "model/host_stats.hpp"

#include <boost/asio/as_tuple.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iterator>
#include <utility>

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
  record.domains = int64_t(domains_.size());
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

void HostPresence::publish(const std::string& uuid) {
  unchecked_.insert(uuid);
  publish();
}

void HostPresence::publish(const std::vector<std::string>& listed) {
  std::set<std::string> found(listed.begin(), listed.end());
  if (!listed_) {
    domains_ = std::move(found);
    listed_ = true;
  } else {
    std::set_symmetric_difference(found.begin(), found.end(), domains_.begin(), domains_.end(),
                                  std::inserter(unchecked_, unchecked_.end()));
  }
  publish();
}

awaitable<void> HostPresence::publish_loop() {
  asio::steady_timer settle(ctx_.io);
  while (dirty_ && !ctx_.stopping) {
    // Changes that come in a burst (a batch being built) are published together.
    settle.expires_after(200ms);
    co_await settle.async_wait(asio::as_tuple(use_awaitable));
    dirty_ = false;
    for (const std::string& uuid : std::exchange(unchecked_, {})) {
      auto state = co_await ctx_.virt(&VirtBackend::state, uuid);
      if (!state)
        unchecked_.insert(uuid);  // libvirt did not answer: looked up with the next publication
      else if (state.value == DomainState::absent)
        domains_.erase(uuid);
      else
        domains_.insert(uuid);
    }
    std::vector<EtcdOp> puts;
    if (domains_published_ != domains_) {
      std::vector<std::string> sorted(domains_.begin(), domains_.end());
      puts.push_back(EtcdOp::put(ctx_.keys.domains(ctx_.host.provider), encode_domains(sorted), lease_));
    }
    puts.push_back(EtcdOp::put(ctx_.keys.host(ctx_.host.provider), encode(host_record()), lease_));
    std::set<std::string> putting = domains_;
    auto written = co_await ctx_.etcd->txn({}, std::move(puts));
    if (written) domains_published_ = std::move(putting);
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
