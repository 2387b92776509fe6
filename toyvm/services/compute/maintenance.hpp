#pragma once
// An operator's disable (`toyvm host disable`) is a key of its own in etcd, outside the lease,
// so that it outlives the agent: a restart or a clean stop never clears it. The agent follows
// it: while it is there the host record says DISABLED and the provider carries
// COMPUTE_STATUS_DISABLED. Only the agent takes the trait off again, so an enable can never be
// overtaken by a disable's stale trait.

#include "services/compute/context.hpp"
#include "services/compute/presence.hpp"
#include "services/compute/registration.hpp"

namespace toyvm::compute {

class HostMaintenanceFollower {
 public:
  HostMaintenanceFollower(AgentContext& ctx, ProviderRegistration& registration, HostPresence& presence)
      : ctx_(ctx), registration_(registration), presence_(presence) {}

  // Reads the key once, retrying until etcd answers: before registering, so that the provider
  // starts with the right traits.
  awaitable<void> load();
  // Follows the key until the agent stops.
  awaitable<void> follow();

 private:
  void apply(const KeyValue* kv);

  AgentContext& ctx_;
  ProviderRegistration& registration_;
  HostPresence& presence_;
  std::optional<HostMaintenance> current_;
};

}  // namespace toyvm::compute
