#pragma once
// Every part of a compute agent, built once, each from the parts it needs and in that order:
// nothing is wired afterwards. The agent adds its feeds and its loops; the unit tests build
// the same parts over fakes of etcd, Placement and libvirt.

#include "model/inventory.hpp"
#include "services/compute/builder.hpp"
#include "services/compute/context.hpp"
#include "services/compute/guest_metadata.hpp"
#include "services/compute/guest_observer.hpp"
#include "services/compute/instances.hpp"
#include "services/compute/mover.hpp"
#include "services/compute/presence.hpp"
#include "services/compute/recorder.hpp"
#include "services/compute/registration.hpp"
#include "services/placer.hpp"
#include "virt/images.hpp"
#include "virt/memory_backend.hpp"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace toyvm::compute {

// What is read and opened on this host before its agent is built: its identity, what it
// offers, where images go, its libvirt, and what the guests' network tells them.
struct HostSetup {
  HostIdentity host;
  Inventory inventory;
  std::vector<std::string> cpu_traits;
  ImageStoreOptions images;
  std::unique_ptr<VirtBackend> backend;
  std::vector<std::string> guest_dns;
  bool dhcp_leases = true;  // its guests' DHCP leases are this machine's libvirt's, worth watching
};

// This host's name, as the system has it.
std::string host_name();

// From [compute] and the host itself; the provider uuid is the state dir's (made on first use).
result<HostSetup> set_up_host(const ComputeConfig& config);
// A simulated host (`toyvm compute --simulate`): the same, on an in-memory hypervisor reached
// by its peers in `hosts` at its move URI, with the inventory it is given and no CPU traits.
result<HostSetup> set_up_simulated_host(const ComputeConfig& config, std::shared_ptr<MemoryHosts> hosts);

struct AgentParts {
  AgentParts(AgentContext& ctx, Inventory inventory, std::vector<std::string> cpu_traits, ImageStoreOptions images);

  Placer placer;
  InstanceRecorder recorder;
  ProviderRegistration registration;
  ImageStore images;
  HostPresence presence;
  HostMaintenanceFollower maintenance;
  Builder builder;
  Mover mover;
  Instances instances;
  GuestObserver observer;
  GuestMetadata metadata;
};

}  // namespace toyvm::compute
