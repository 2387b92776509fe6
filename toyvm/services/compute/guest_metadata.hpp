#pragma once
// The metadata service of this host's guests, served in the agent's own event loop. Its
// answers come straight from the agent's instances: only guests of this host are known to it,
// so guests of other hosts that share an address (each host's NAT network hands out the
// same subnet) can never be answered here, and it needs no etcd watch of its own.

#include "services/compute/context.hpp"
#include "services/compute/instances.hpp"
#include "services/metadata_http.hpp"

#include <memory>
#include <string>

namespace toyvm::compute {

class GuestMetadata {
 public:
  GuestMetadata(AgentContext& ctx, const Instances& instances);

  // With [compute] metadata_interface: puts the metadata address on that interface and
  // serves [mdserver] listen there, until the agent stops. An interface that comes back
  // (libvirt restarted the network, so the bridge is new) is served again. Failures are
  // logged; the agent runs on without it.
  awaitable<void> run();

  // The guest of this host that has `ip`, if exactly one has it; null otherwise.
  std::shared_ptr<const GuestView> find(const std::string& ip) const;

 private:
  void serve_on(const std::string& interface);

  AgentContext& ctx_;
  const Instances& instances_;
  MetadataHttpServer http_;
};

}  // namespace toyvm::compute
