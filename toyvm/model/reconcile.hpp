#pragma once
// The compute agent's decision for one instance: desired state (etcd) against actual state
// (libvirt) and the phase the agent last recorded. Pure, so every case is unit-tested.

#include "model/domain.hpp"
#include "model/records.hpp"

#include <optional>
#include <string_view>

namespace toyvm {

// Where an instance stands as far as this host has recorded it. One value, not a set of
// flags: every combination the decision sees is one of these.
enum class Phase {
  unrecorded,  // nothing recorded here yet (SCHEDULED by a schedule, or a record of another host)
  building,
  active,
  stopped,
  failed,    // ERROR, and what it holds (allocation, group membership) may not be given back yet
  released,  // ERROR, holding nothing
};

// The phase a record of this host's puts the instance in. An ERROR record read back (after a
// restart) counts as failed: giving back again is harmless, forgetting to is a leak.
Phase phase_of(InstanceState recorded);
std::string_view to_string(Phase phase);
// The state a record of this host says for the phase; nothing while unrecorded.
std::optional<InstanceState> recorded_state(Phase phase);

// What the work key asks for; nothing when it no longer exists.
using Desired = std::optional<PowerState>;

enum class ReconcileAction {
  none,
  build,          // define and start, record BUILDING then ACTIVE
  start,          // start a stopped domain (resume one a move left paused), record ACTIVE
  stop,           // stop a running domain, record STOPPED
  record_active,  // the domain runs but etcd does not say so (after a restart)
  record_stopped,
  remove,         // destroy the domain, release the allocation, delete the keys
  remove_domain,  // the work key is gone, or the instance is ERROR: destroy the domain only
  release,        // an ERROR instance: give back its allocation and group membership
  adopt_stop,     // the guest stopped without toyvm: record STOPPED, and its desired power follows
  record_crash,   // the guest crashed: ERROR launch_failure, then it gives back what it holds
};
std::string_view to_string(ReconcileAction action);

// What becomes of a running guest that crashed ([compute] on_guest_crash).
enum class CrashPolicy { restart, error };

// `cause`: why a shut-off domain stopped, for work that should run and was recorded ACTIVE.
ReconcileAction decide(Desired desired, DomainState actual, Phase phase, StopCause cause = StopCause::unknown,
                       CrashPolicy on_crash = CrashPolicy::restart);

}  // namespace toyvm
