#pragma once
// What the agent knows of each instance etcd assigns to it: the desired state, what it last
// recorded, and what its guest looks like. One slot per instance, owned by the agent; the
// reconciler steps it, the guest observer watches it.

#include "core/async.hpp"
#include "model/records.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace toyvm::compute {

struct InstanceSlot {
  std::optional<WorkSpec> desired;  // empty: the work key is gone
  int64_t revision = 0;             // etcd revision of what `desired` reflects; older news is stale
  std::optional<InstanceState> recorded;  // as the instance key says for this host
  bool recorded_loaded = false;     // `recorded` was read back from etcd (after a restart)
  bool released = false;            // an ERROR instance's allocation was given back
  std::optional<InstanceRecord> failure;  // the ERROR record as last written or read
  bool allocation_elsewhere = false;  // a move that did not happen left it on another host
  bool busy = false;                // a reconcile step runs for it
  bool dirty = false;               // news arrived during that step: run another
  std::string ip;                   // the guest's address once libvirt knows it
  std::chrono::steady_clock::time_point address_deadline;  // stop looking for it then
  bool address_given_up = false;    // the deadline passed without one: recorded, so --wait ends
  int64_t console_published = -1;   // console log size last put in etcd
  asio::steady_timer* waiting = nullptr;  // a build waiting for its image; cancelled on destroy
  // Its work value cannot be decoded (a newer writer's, or damaged): it is there, so it is no
  // reason to remove anything; nothing is done for the instance until it can be read.
  bool unreadable = false;

  // Destroy requested (or the work gone): a build in progress stops at its next step.
  bool cancelled() const { return !desired || desired->power == PowerState::deleted; }
  // Known work and no step running: what it looks like may be recorded.
  bool at_rest() const { return desired && !busy && !unreadable; }
};

using InstanceSlots = std::map<std::string, InstanceSlot>;

}  // namespace toyvm::compute
