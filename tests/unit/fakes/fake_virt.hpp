#pragma once
// A hypervisor in memory, for unit tests of the agent's decisions: domains that are made,
// started, stopped and destroyed on request, guests that stop by themselves when a test says
// so, and failures on demand. Called from the agent's worker threads, hence the lock.

#include "virt/backend.hpp"

#include <map>
#include <mutex>
#include <optional>

namespace toyvm::fakes {


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
  // The next create fails with this code (virt_unavailable is retried, others fail the build).
  void fail_next_create(errc code) {
    std::lock_guard lock(mutex_);
    create_failure_ = code;
  }

  // --- VirtBackend ---
  result<void> create(const DomainSpec& spec) override {
    std::lock_guard lock(mutex_);
    ++creates_;
    if (create_failure_) return Error(*std::exchange(create_failure_, std::nullopt), "the fake hypervisor refused");
    Domain& d = domains_[spec.uuid];
    d.state = spec.start ? DomainState::running : DomainState::stopped;
    return {};
  }
  result<void> start(const std::string& uuid) override { return power(uuid, DomainState::running); }
  result<void> shutdown(const std::string&) override { return Error(errc::launch_failure, "no ACPI here"); }
  result<void> stop(const std::string& uuid) override { return power(uuid, DomainState::stopped); }
  result<void> destroy(const std::string& uuid) override {
    std::lock_guard lock(mutex_);
    domains_.erase(uuid);
    return {};
  }
  result<void> ensure_network() override { return {}; }
  result<std::string> prepare_incoming(const DomainSpec& spec) override { return "<domain>" + spec.uuid + "</domain>"; }
  result<void> send_disk(const std::string&, const std::string&, const std::string&) override {
    return Error(errc::launch_failure, "the fake cannot copy disks");
  }
  result<void> receive_disk(const DomainSpec&, const std::string&) override {
    return Error(errc::launch_failure, "the fake cannot copy disks");
  }
  result<void> resize_in_place(const DomainSpec&) override {
    return Error(errc::launch_failure, "the fake cannot resize");
  }
  result<MigrationStats> migrate(const std::string& uuid, const MigrationTarget&) override {
    std::lock_guard lock(mutex_);
    if (!domains_.erase(uuid)) return Error(errc::not_found, "no such domain");
    return MigrationStats{};
  }
  result<bool> migrating(const std::string&) override { return false; }
  result<void> abort_migration(const std::string&) override { return {}; }
  result<std::vector<std::string>> network_dns() override { return std::vector<std::string>{}; }
  result<std::vector<GuestAddress>> addresses(const std::string& uuid) override {
    std::lock_guard lock(mutex_);
    auto found = domains_.find(uuid);
    return found == domains_.end() ? std::vector<GuestAddress>{} : found->second.addresses;
  }
  result<DomainState> state(const std::string& uuid) override {
    std::lock_guard lock(mutex_);
    auto found = domains_.find(uuid);
    return found == domains_.end() ? DomainState::absent : found->second.state;
  }
  result<DomainUsage> usage(const std::string&) override { return DomainUsage{}; }
  result<StopCause> stop_cause(const std::string& uuid) override {
    std::lock_guard lock(mutex_);
    auto found = domains_.find(uuid);
    return found == domains_.end() ? StopCause::unknown : found->second.cause;
  }
  void on_lifecycle(std::function<void(const std::string&, bool)>) override {}
  result<std::vector<std::string>> list() override {
    std::lock_guard lock(mutex_);
    std::vector<std::string> uuids;
    for (const auto& [uuid, d] : domains_) uuids.push_back(uuid);
    return uuids;
  }

 private:
  result<void> power(const std::string& uuid, DomainState state) {
    std::lock_guard lock(mutex_);
    auto found = domains_.find(uuid);
    if (found == domains_.end()) return Error(errc::not_found, "no such domain");
    found->second.state = state;
    found->second.cause = StopCause::unknown;
    return {};
  }

  mutable std::mutex mutex_;
  std::map<std::string, Domain> domains_;
  int creates_ = 0;
  std::optional<errc> create_failure_;
};

}  // namespace toyvm::fakes
