#pragma once
// A hypervisor in memory, for unit tests of the agent's decisions: domains that are made,
// started, stopped and destroyed on request, guests that stop by themselves when a test says
// so, and failures on demand. Called from the agent's worker threads, hence the lock.

#include "virt/backend.hpp"

#include <map>
#include <mutex>

namespace toyvm::fakes {

template <class T>
VirtResult<T> ok(T value) {
  return VirtResult<T>{std::move(value), std::nullopt};
}
inline VirtResult<bool> refused(std::string reason, std::string message) {
  return VirtResult<bool>{false, VirtFailure{std::move(reason), std::move(message)}};
}

class FakeVirt : public VirtBackend {
 public:
  struct Domain {
    DomainState state = DomainState::stopped;
    StopCause cause = StopCause::unknown;
    std::vector<GuestAddress> addresses;
  };

  // --- what a test arranges and reads ---
  void set(const std::string& uuid, Domain domain) {
    std::lock_guard lock(mutex_);
    domains_[uuid] = std::move(domain);
  }
  std::optional<Domain> domain(const std::string& uuid) const {
    std::lock_guard lock(mutex_);
    auto found = domains_.find(uuid);
    return found == domains_.end() ? std::nullopt : std::optional<Domain>(found->second);
  }
  int creates() const {
    std::lock_guard lock(mutex_);
    return creates_;
  }
  // The next create fails with this reason ("libvirt_unavailable" is retried, others fail the build).
  void fail_next_create(std::string reason) {
    std::lock_guard lock(mutex_);
    create_failure_ = std::move(reason);
  }

  // --- VirtBackend ---
  VirtResult<bool> create(const DomainSpec& spec) override {
    std::lock_guard lock(mutex_);
    ++creates_;
    if (!create_failure_.empty()) {
      std::string reason = std::exchange(create_failure_, {});
      return refused(reason, "the fake hypervisor refused");
    }
    Domain& d = domains_[spec.uuid];
    d.state = spec.start ? DomainState::running : DomainState::stopped;
    return ok(true);
  }
  VirtResult<bool> start(const std::string& uuid) override { return power(uuid, DomainState::running); }
  VirtResult<bool> shutdown(const std::string&) override { return refused("virt_error", "no ACPI here"); }
  VirtResult<bool> stop(const std::string& uuid) override { return power(uuid, DomainState::stopped); }
  VirtResult<bool> destroy(const std::string& uuid) override {
    std::lock_guard lock(mutex_);
    domains_.erase(uuid);
    return ok(true);
  }
  VirtResult<bool> ensure_network() override { return ok(true); }
  VirtResult<std::vector<std::string>> network_dns() override { return ok(std::vector<std::string>{}); }
  VirtResult<std::vector<GuestAddress>> addresses(const std::string& uuid) override {
    std::lock_guard lock(mutex_);
    auto found = domains_.find(uuid);
    return ok(found == domains_.end() ? std::vector<GuestAddress>{}
                                                                             : found->second.addresses);
  }
  VirtResult<DomainState> state(const std::string& uuid) override {
    std::lock_guard lock(mutex_);
    auto found = domains_.find(uuid);
    return ok(found == domains_.end() ? DomainState::absent : found->second.state);
  }
  VirtResult<DomainUsage> usage(const std::string&) override { return ok(DomainUsage{}); }
  VirtResult<StopCause> stop_cause(const std::string& uuid) override {
    std::lock_guard lock(mutex_);
    auto found = domains_.find(uuid);
    return ok(found == domains_.end() ? StopCause::unknown : found->second.cause);
  }
  void on_lifecycle(std::function<void(const std::string&, bool)>) override {}
  VirtResult<std::vector<std::string>> list() override {
    std::lock_guard lock(mutex_);
    std::vector<std::string> uuids;
    for (const auto& [uuid, d] : domains_) uuids.push_back(uuid);
    return ok(std::move(uuids));
  }

 private:
  VirtResult<bool> power(const std::string& uuid, DomainState state) {
    std::lock_guard lock(mutex_);
    auto found = domains_.find(uuid);
    if (found == domains_.end()) return refused("virt_error", "no such domain");
    found->second.state = state;
    found->second.cause = StopCause::unknown;
    return ok(true);
  }

  mutable std::mutex mutex_;
  std::map<std::string, Domain> domains_;
  int creates_ = 0;
  std::string create_failure_;
};

}  // namespace toyvm::fakes
