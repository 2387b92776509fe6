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
};

}  // namespace toyvm::fakes
