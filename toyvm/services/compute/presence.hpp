#pragma once
// The host's presence in etcd: a host record under a lease that the agent keeps alive, so
// that it vanishes when the agent dies. Schedulers only pick hosts whose record is there, and
// READY. Beside it, under the same lease, the host's figures (CIAO's STATS).

#include "services/compute/context.hpp"

#include <functional>
#include <set>

namespace toyvm::compute {

class HostPresence {
 public:
  // `instance_count`: how many instances hold work here now (the agent's instances tell).
  HostPresence(AgentContext& ctx, std::function<size_t()> instance_count)
      : ctx_(ctx), instance_count_(std::move(instance_count)) {}

  void set_capacity(ResourceAmounts capacity) { capacity_ = std::move(capacity); }
  // An operator's disable makes the record DISABLED (call publish() to put it).
  void set_maintenance(std::optional<HostMaintenance> maintenance) { maintenance_ = std::move(maintenance); }
  // Grants a lease and puts the host record under it; retried until etcd answers.
  awaitable<void> announce();
  // Keeps the lease alive until the agent stops; a lost lease is announced again.
  awaitable<void> keep_alive();
  // Brings etcd up to date with the host record, when it changed, and with the host's domains
  // (a key each, for `toyvm audit` and `show --hosts`). Calls coalesce: under a burst of
  // builds one transaction is in flight and at most one more follows it.
  void publish();
  // The same after a step may have made or removed `uuid`'s domain: the publication looks
  // that one domain up, so a build costs the same on a host with a thousand.
  void publish(const std::string& uuid);
  // The same with every domain a full listing found (at start and each resync). Where it
  // disagrees with what is known, each such domain is looked up again: a listing may have
  // been taken before a step that the lookups already saw.
  void publish(const DomainStates& listed);
  // A step that knows it made (or removed) `uuid`'s domain writes its key in the step's own
  // transaction: the op to add (no put while there is no lease), then recorded() once etcd
  // has made it. A step whose transaction went unanswered calls publish(uuid) instead.
  std::optional<EtcdOp> domain_put(const std::string& uuid) const;
  EtcdOp domain_erase(const std::string& uuid) const;
  void recorded(const std::string& uuid, const EtcdOp& op);
  // Measures the host and puts its figures every stats_interval: one small write each.
  awaitable<void> report_stats();
  // The record vanishes at once instead of when the lease expires.
  awaitable<void> revoke();

  // CIAO's READY/FULL: FULL once the host has max_instances instances (0: no limit).
  bool full() const;
  size_t instance_count() const { return instance_count_(); }

 private:
  HostRecord host_record() const;
  awaitable<void> publish_loop();
  // Puts and erases domain keys, and the host record when `host` is set, in transactions of
  // at most etcd's 128 operations; what etcd made under the current lease counts as published.
  awaitable<void> put_changes(std::vector<std::pair<std::string, bool>> domains, std::optional<HostRecord> host);

  AgentContext& ctx_;
  std::function<size_t()> instance_count_;
  ResourceAmounts capacity_;
  std::optional<HostMaintenance> maintenance_;
  std::optional<HostStats> stats_;  // as last measured, put again with a new lease
  int64_t lease_ = 0;
  int64_t started_at_ = unix_seconds();
  std::set<std::string> domains_;    // this host's domains, as last seen
  std::set<std::string> unchecked_;  // domains to look up before the next put
  bool listed_ = false;              // domains_ started from a full listing
  std::set<std::string> domains_published_;  // keys put under the current lease
  std::optional<HostRecord> host_published_;  // the host record as last put
  bool dirty_ = false;
  bool publishing_ = false;
};

}  // namespace toyvm::compute
