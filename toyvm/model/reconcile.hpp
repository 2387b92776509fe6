#pragma once
// The compute agent's decision for one instance: desired state (etcd) against actual state
// (libvirt) and what the agent last recorded. Pure, so every case is unit-tested.

#include "model/domain.hpp"
#include "model/records.hpp"

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
  adopt_stop,     // the guest stopped without toyvm: record STOPPED, and its desired power follows
  record_crash,   // the guest crashed: ERROR launch_failure, then it gives back what it holds
};

// What becomes of a running guest that crashed ([compute] on_guest_crash).
enum class CrashPolicy { restart, error };

// `desired` is empty when the work key no longer exists; `recorded` is what the instance key
// says this host recorded, empty when nothing is recorded. `released`: this agent gave an
// ERROR instance's allocation back since it started (releasing again is harmless, so after a
// restart it is done once more). `cause`: why a shut-off domain stopped, for work that should
// run and was recorded ACTIVE.
ReconcileAction decide(const WorkSpec* desired, DomainState actual, std::optional<InstanceState> recorded,
                       bool released, StopCause cause = StopCause::unknown,
                       CrashPolicy on_crash = CrashPolicy::restart);

}  // namespace toyvm
