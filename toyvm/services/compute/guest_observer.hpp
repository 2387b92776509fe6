#pragma once
// What the agent learns from running guests: their DHCP addresses (libvirt has no event for
// a lease, so it looks twice a second) and the tail of their serial consoles.

#include "services/compute/context.hpp"
#include "services/compute/recorder.hpp"
#include "services/compute/slots.hpp"

#include <string>
#include <vector>

namespace toyvm::compute {

class GuestObserver {
 public:
  GuestObserver(AgentContext& ctx, InstanceSlots& slots, InstanceRecorder& recorder)
      : ctx_(ctx), slots_(slots), recorder_(recorder) {}

  // Until the agent stops.
  awaitable<void> run();

 private:
  awaitable<void> find_address(std::string uuid);
  awaitable<void> give_up_address(std::string uuid);
  awaitable<void> publish_consoles(std::vector<std::string> uuids);

  AgentContext& ctx_;
  InstanceSlots& slots_;
  InstanceRecorder& recorder_;
};

}  // namespace toyvm::compute
