#pragma once
// The compute agent's decision for one instance: desired state (etcd) against actual state
// (libvirt) and what the agent last recorded. Pure, so every case is unit-tested.

#include "model/records.hpp"
#include "virt/backend.hpp"

#include <optional>

namespace toyvm {

enum class ReconcileAction {
  none,
  build,          // define and start, record BUILDING then ACTIVE
  start,          // start a stopped domain, record ACTIVE
  stop,           // stop a running domain, record STOPPED
  record_active,  // the domain runs but etcd does not say so (after a restart)
  record_stopped,
  remove,         // destroy the domain, release the allocation, delete the keys
  remove_domain,  // the work key is gone, or the instance is ERROR: destroy the domain only
  release,        // an ERROR instance: give back its allocation and group membership
};

// `desired` is empty when the work key no longer exists; `recorded` is what the instance key
// says this host recorded, empty when nothing is recorded. `released`: this agent gave an
// ERROR instance's allocation back since it started (releasing again is harmless, so after a
// restart it is done once more).
ReconcileAction decide(const WorkSpec* desired, DomainState actual, std::optional<InstanceState> recorded,
                       bool released);

}  // namespace toyvm
