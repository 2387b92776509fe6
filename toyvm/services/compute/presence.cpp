#include "services/compute/presence.hpp"

#include "model/host_stats.hpp"
#include "model/uuid.hpp"

#include <boost/asio/as_tuple.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iterator>
#include <random>
#include <utility>

namespace toyvm::compute {

using namespace std::chrono_literals;

bool HostPresence::full() const {
  int limit = ctx_.config.compute.max_instances;
  return limit > 0 && instance_count() >= size_t(limit);
}

HostRecord HostPresence::host_record() const {
  HostRecord record;
  record.name = ctx_.host.name;
  record.provider = ctx_.host.provider;
  record.capacity = capacity_;
  record.agent_version = TOYVM_VERSION;
  record.started_at = started_at_;
  record.status = maintenance_ ? "DISABLED" : full() ? "FULL" : "READY";
  return record;
}

awaitable<void> HostPresence::announce() {
  Backoff backoff;
  while (!ctx_.stop.requested()) {
    auto lease = co_await ctx_.etcd->lease_grant(ctx_.config.compute.lease_ttl.count());
    if (lease) {
      HostRecord host = host_record();
      // The domain keys an earlier run left under its own lease go; the known ones follow under this one.
      const std::string domains = ctx_.keys.domains_prefix(ctx_.host.provider);
      std::vector<EtcdOp> ops{EtcdOp::put(ctx_.keys.host(ctx_.host.provider), encode(host), *lease),
                              EtcdOp::erase(domains, prefix_range_end(domains))};
      if (stats_) ops.push_back(EtcdOp::put(ctx_.keys.stats(ctx_.host.provider), encode(*stats_), *lease));
      auto put = co_await ctx_.etcd->txn({}, std::move(ops));
      if (put) {
        lease_ = *lease;
        host_published_ = std::move(host);
        domains_published_.clear();
        if (!domains_.empty()) publish();
        co_return;
      }
    }
    spdlog::warn("announcing host in etcd at {}: unavailable; retrying", ctx_.etcd->endpoints_text());
    co_await backoff.wait();
  }
}

// Unknown is not gone: a keep-alive etcd did not answer (it restarts, a member is cut off) is
// asked again on a new stream; only etcd saying the lease has expired announces the host anew,
// which would take its domain keys away and put them back.
awaitable<void> HostPresence::keep_alive() {
  const Duration interval = lease_renewal_interval(ctx_.config.compute.lease_ttl);
  Backoff backoff;
  std::mt19937_64 rng{random_seed()};
  while (!ctx_.stop.requested()) {
    auto keeper = ctx_.etcd->keep_alive(lease_);
    while (!ctx_.stop.requested()) {
      auto ttl = co_await keeper->ping();
      if (ttl && *ttl <= 0) break;
      if (!ttl) {
        if (backoff.fresh())
          spdlog::warn("keeping the etcd lease alive: {}; asking again", ttl.error().message());
        co_await backoff.wait();
        keeper = ctx_.etcd->keep_alive(lease_);
        continue;
      }
      backoff.reset();
      if (!co_await ctx_.stop.sleep_on_grid(interval)) break;
    }
    if (ctx_.stop.requested()) break;
    // Hosts whose leases lapsed together (etcd fell behind applying) announce themselves again
    // spread over an interval, not all at once on an etcd that is behind.
    std::uniform_int_distribution<int64_t> spread(0, std::chrono::duration_cast<std::chrono::milliseconds>(interval).count());
    const std::chrono::milliseconds pause(spread(rng));
    spdlog::warn("lost the etcd lease; announcing the host again in {} ms", pause.count());
    if (!co_await ctx_.stop.sleep(pause)) break;
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

void HostPresence::publish(const DomainStates& listed) {
  std::set<std::string> found;
  for (const auto& [uuid, state] : listed) found.insert(found.end(), uuid);
  if (!listed_) {
    domains_ = std::move(found);
    listed_ = true;
  } else {
    std::set_symmetric_difference(found.begin(), found.end(), domains_.begin(), domains_.end(),
                                  std::inserter(unchecked_, unchecked_.end()));
  }
  publish();
}

std::optional<EtcdOp> HostPresence::domain_put(const std::string& uuid) const {
  if (!lease_) return std::nullopt;
  return EtcdOp::put(ctx_.keys.domain(ctx_.host.provider, uuid), "", lease_);
}

EtcdOp HostPresence::domain_erase(const std::string& uuid) const {
  return EtcdOp::erase(ctx_.keys.domain(ctx_.host.provider, uuid));
}

void HostPresence::recorded(const std::string& uuid, const EtcdOp& op) {
  const bool present = op.kind == EtcdOp::Kind::put;
  const bool under_old_lease = present && op.lease != lease_;  // announced again meanwhile
  if (present) {
    domains_.insert(uuid);
    if (!under_old_lease) domains_published_.insert(uuid);
  } else {
    domains_.erase(uuid);
    domains_published_.erase(uuid);
  }
  // A publication under way may have looked this domain up before the step: it looks again.
  if (publishing_) unchecked_.insert(uuid);
  if (publishing_ || under_old_lease || host_record() != host_published_) publish();
}

awaitable<void> HostPresence::publish_loop() {
  asio::steady_timer settle(ctx_.io);
  while (dirty_ && !ctx_.stop.requested()) {
    // Changes that come in a burst (a batch being built) are published together.
    settle.expires_after(200ms);
    co_await settle.async_wait(asio::as_tuple(use_awaitable));
    dirty_ = false;
    for (const std::string& uuid : std::exchange(unchecked_, {})) {
      auto state = co_await ctx_.virt(&VirtBackend::state, uuid);
      if (!state)
        unchecked_.insert(uuid);  // libvirt did not answer: looked up with the next publication
      else if (*state == DomainState::absent)
        domains_.erase(uuid);
      else
        domains_.insert(uuid);
    }
    std::vector<std::pair<std::string, bool>> changes;
    for (const std::string& uuid : domains_)
      if (!domains_published_.count(uuid)) changes.emplace_back(uuid, true);
    for (const std::string& uuid : domains_published_)
      if (!domains_.count(uuid)) changes.emplace_back(uuid, false);
    // (Built outside co_await: GCC 12 destroys a conditional's temporary inside it twice.)
    std::optional<HostRecord> host = host_record();
    if (host == host_published_) host.reset();
    co_await put_changes(std::move(changes), std::move(host));
  }
  publishing_ = false;
}

awaitable<void> HostPresence::put_changes(std::vector<std::pair<std::string, bool>> domains,
                                          std::optional<HostRecord> host) {
  const int64_t lease = lease_;
  constexpr size_t max_ops = 128;
  for (size_t first = 0; first < domains.size() || host;) {
    std::vector<EtcdOp> ops;
    const size_t last = std::min(domains.size(), first + (host ? max_ops - 1 : max_ops));
    for (size_t i = first; i < last; ++i) {
      const std::string key = ctx_.keys.domain(ctx_.host.provider, domains[i].first);
      ops.push_back(domains[i].second ? EtcdOp::put(key, "", lease) : EtcdOp::erase(key));
    }
    if (host) ops.push_back(EtcdOp::put(ctx_.keys.host(ctx_.host.provider), encode(*host), lease));
    auto written = co_await ctx_.etcd->txn({}, std::move(ops));
    if (!written) co_return;  // published again with the next change, or the next resync
    if (lease != lease_) co_return;  // announced again meanwhile: the announcement publishes
    for (size_t i = first; i < last; ++i) {
      if (domains[i].second)
        domains_published_.insert(domains[i].first);
      else
        domains_published_.erase(domains[i].first);
    }
    if (host) {
      host_published_ = std::move(host);
      host.reset();
    }
    first = last;
  }
}

awaitable<void> HostPresence::report_stats() {
  const auto interval = ctx_.config.compute.stats_interval;
  do {
    auto stats = co_await ctx_.virt(&VirtBackend::host_stats);
    if (!stats) {
      spdlog::warn("cannot measure this host's memory, disk and load: {}", stats.error().message());
    } else if (!stats_ || worth_reporting(*stats_, *stats)) {
      // Put with the host record at every announce; again only once they moved enough.
      stats_ = *stats;
      if (lease_) co_await ctx_.etcd->put(ctx_.keys.stats(ctx_.host.provider), encode(*stats), lease_);
    }
  } while (co_await ctx_.stop.sleep_on_grid(interval));
}

awaitable<void> HostPresence::revoke() {
  if (lease_) co_await ctx_.etcd->lease_revoke(lease_);
}

}  // namespace toyvm::compute
