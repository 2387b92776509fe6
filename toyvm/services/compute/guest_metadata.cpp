#include "services/compute/guest_metadata.hpp"

#include "virt/host_network.hpp"

#include <net/if.h>
#include <spdlog/spdlog.h>

namespace toyvm::compute {

using namespace std::chrono_literals;

GuestMetadata::GuestMetadata(AgentContext& ctx, const Instances& instances)
    : ctx_(ctx), instances_(instances), http_(ctx.io, ctx.config.mdserver, [this](const std::string& ip) { return find(ip); }) {}

awaitable<void> GuestMetadata::run() {
  const std::string& interface = ctx_.config.compute.metadata_interface;
  if (interface.empty() || ctx_.config.mdserver.listen.empty()) co_return;
  if (auto configured = http_.configure(); !configured) {
    spdlog::error("metadata service: {}", configured.error().message());
    co_return;
  }
  unsigned served = 0;  // the interface's index when last set up
  do {
    unsigned index = if_nametoindex(interface.c_str());
    if (index != 0 && index != served) {
      served = index;
      http_.stop_listening();
      serve_on(interface);
    }
  } while (co_await ctx_.stop.sleep(2s));
  http_.stop_listening();
}

void GuestMetadata::serve_on(const std::string& interface) {
  for (const std::string& listen : ctx_.config.mdserver.listen) {
    auto endpoint = MetadataHttpServer::parse_listen(listen);
    if (!endpoint) {
      spdlog::error("metadata service: {}", MetadataHttpServer::bad_listen("[mdserver] listen", listen));
      continue;
    }
    if (auto added = add_interface_address(interface, endpoint->address().to_string()); !added) {
      spdlog::error("metadata service: {}", added.error().message());
      continue;
    }
    // Bound to the interface: another agent of this machine may serve the same address on its own.
    if (auto served = http_.listen(listen, interface); !served)
      spdlog::error("metadata service: {}", served.error().message());
  }
}

std::shared_ptr<const GuestView> GuestMetadata::find(const std::string& ip) const {
  const WorkSpec* spec = nullptr;
  for (const auto& [uuid, instance] : instances_.all()) {
    // An ERROR instance gave its guest up: its old address may be another guest's by now.
    const Phase phase = instance->phase();
    if (instance->ip() != ip || instance->cancelled() || phase == Phase::failed || phase == Phase::released) continue;
    // Two guests claim one address (one of them stale): answer neither rather than guess.
    if (spec) return nullptr;
    spec = instance->work();
  }
  if (!spec) return nullptr;
  return std::make_shared<const GuestView>(ctx_.describe_guest(*spec, ip));
}

}  // namespace toyvm::compute
