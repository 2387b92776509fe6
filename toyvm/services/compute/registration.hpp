#pragma once
// The host as a Placement resource provider: a stable uuid kept in the state dir (a restart
// never makes a second provider), its inventory, traits and availability zone, and the
// operator's disable it follows.

#include "model/inventory.hpp"
#include "services/compute/context.hpp"
#include "services/compute/presence.hpp"

#include <filesystem>
#include <string>
#include <vector>

namespace toyvm::compute {

// The provider uuid in `state_dir`, made on first use (then `*made` is set: no Placement has it).
result<std::string> load_or_create_provider_uuid(const std::filesystem::path& state_dir, bool* made = nullptr);

// A host whose state dir was lost is still its provider in Placement, under its name (names
// are unique there): with no uuid in `state_dir`, the uuid of the provider named `name` is
// written there, so the host comes back with its instances instead of failing to register a
// second provider of the same name. While that provider's agent is alive (its lease runs, or
// another agent has the same name) it waits. Retries while Placement or etcd does not answer.
awaitable<void> adopt_provider_by_name(Placement& placement, EtcdClient& etcd, KeyLayout keys, StopSignal& stop,
                                       std::filesystem::path state_dir, std::string name);

class ProviderRegistration {
 public:
  ProviderRegistration(AgentContext& ctx, Inventory inventory, std::vector<std::string> cpu_traits)
      : ctx_(ctx), inventory_(std::move(inventory)), cpu_traits_(std::move(cpu_traits)) {}

  const Inventory& inventory() const { return inventory_; }
  // Registers, retrying while Placement does not answer, until it is done or the agent stops.
  // Setting the traits afresh also clears the disabled mark of a clean stop.
  awaitable<void> register_until_done();
  // COMPUTE_STATUS_DISABLED, which every schedule forbids: no candidate is spent on a host
  // that is not running.
  awaitable<void> mark_disabled();
  // An operator's disable (`toyvm host disable`): the provider carries COMPUTE_STATUS_DISABLED
  // while it lasts. Once registered, the change goes to Placement in the background, retried.
  void set_operator_disabled(bool disabled);

 private:
  awaitable<result<void>> register_once();
  awaitable<void> update_status();
  std::vector<std::string> traits_with_status(bool disabled) const;

  AgentContext& ctx_;
  Inventory inventory_;
  std::vector<std::string> cpu_traits_;
  std::vector<std::string> traits_;  // the host's own, as last set in Placement
  bool operator_disabled_ = false;   // wanted
  bool disabled_in_placement_ = false;
  bool registered_ = false;
  bool updating_ = false;
};

// An operator's disable (`toyvm host disable`) is a key of its own in etcd, outside the lease,
// so that it outlives the agent: a restart or a clean stop never clears it. The agent follows
// it: while it is there the host record says DISABLED and the provider carries
// COMPUTE_STATUS_DISABLED. Only the agent takes the trait off again, so an enable can never be
// overtaken by a disable's stale trait.
class HostMaintenanceFollower {
 public:
  HostMaintenanceFollower(AgentContext& ctx, ProviderRegistration& registration, HostPresence& presence)
      : ctx_(ctx), registration_(registration), presence_(presence) {}

  // Reads the key once, retrying until etcd answers: before registering, so that the provider
  // starts with the right traits.
  awaitable<void> load();
  // Follows the key until the agent stops, from load()'s reading: one read of it a start.
  awaitable<void> follow();
  // Whether the host is disabled, as last heard; nothing before the key was first read.
  std::optional<bool> disabled() const { return heard_ ? std::optional<bool>(current_.has_value()) : std::nullopt; }

 private:
  void apply(const KeyValue* kv);

  AgentContext& ctx_;
  ProviderRegistration& registration_;
  HostPresence& presence_;
  std::optional<HostMaintenance> current_;
  bool heard_ = false;
  int64_t loaded_revision_ = 0;  // of load()'s reading, until follow() watches from it
};

}  // namespace toyvm::compute
