#pragma once
// The in-memory hypervisor (virt/memory_backend.hpp) for unit tests of the agent's decisions,
// with failures on demand.

#include "virt/memory_backend.hpp"

#include <mutex>
#include <optional>

namespace toyvm::fakes {

class FakeVirt : public MemoryVirt {
 public:
  // The next create fails with this code (virt_unavailable is retried, others fail the build).
  void fail_next_create(errc code) {
    std::lock_guard lock(mutex_);
    create_failure_ = code;
  }

  // Every create asked for, refused or not.
  int creates() const {
    std::lock_guard lock(mutex_);
    return MemoryVirt::creates() + refused_;
  }

  // The guest hears ACPI's power button from its `press`th press on, and powers itself off
  // (a guest still booting misses it). 0: no ACPI, as the in-memory hypervisor has.
  void power_off_at_press(int press) {
    std::lock_guard lock(mutex_);
    heard_at_ = press;
  }

  int presses() const {
    std::lock_guard lock(mutex_);
    return presses_;
  }

  // Domains' states asked for one at a time (a listing tells them all at once).
  int state_asks() const {
    std::lock_guard lock(mutex_);
    return state_asks_;
  }

  result<DomainState> state(const std::string& uuid) override {
    {
      std::lock_guard lock(mutex_);
      ++state_asks_;
    }
    return MemoryVirt::state(uuid);
  }

  result<void> shutdown(const std::string& uuid) override {
    {
      std::lock_guard lock(mutex_);
      if (heard_at_ == 0) return MemoryVirt::shutdown(uuid);
      if (++presses_ < heard_at_) return {};
    }
    auto domain = MemoryVirt::domain(uuid);
    if (!domain) return Error(errc::not_found, "no such domain");
    domain->state = DomainState::stopped;
    domain->cause = StopCause::shutdown;
    MemoryVirt::set(uuid, *domain);
    return {};
  }

  result<void> create(const DomainSpec& spec) override {
    {
      std::lock_guard lock(mutex_);
      if (create_failure_) {
        ++refused_;
        return Error(*std::exchange(create_failure_, std::nullopt), "the fake hypervisor refused");
      }
    }
    return MemoryVirt::create(spec);
  }

 private:
  mutable std::mutex mutex_;
  std::optional<errc> create_failure_;
  int refused_ = 0;
  int heard_at_ = 0;
  int presses_ = 0;
  int state_asks_ = 0;
};

}  // namespace toyvm::fakes
