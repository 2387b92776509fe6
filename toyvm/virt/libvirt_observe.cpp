// What the libvirt backend reads of domains: their state, why they stopped, what they use,
// their guests' addresses, which of them this agent owns, and libvirt's lifecycle events.

#include "model/host_stats.hpp"
#include "virt/host_network.hpp"
#include "virt/libvirt_backend.hpp"
#include "virt/libvirt_xml.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

namespace toyvm::libvirt_impl {

result<DomainState> LibvirtBackend::state(const std::string& uuid) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  switch (lookup(uuid, dom)) {
    case Lookup::absent:
    case Lookup::foreign: return DomainState::absent;  // none of this agent's
    case Lookup::failed: return fail(errc::launch_failure);
    case Lookup::mine: break;
  }
  return state_of(dom.ptr);
}

result<DomainState> LibvirtBackend::state_of(virDomainPtr dom) {
  int active = api->virDomainIsActive(dom);
  int state = 0, reason = 0;
  if (active == 0) return DomainState::stopped;
  if (active > 0 && api->virDomainGetState(dom, &state, &reason, 0) == 0) return domain_state(state, reason);
  if (last_error_is(VIR_ERR_NO_DOMAIN)) return DomainState::absent;  // gone since it was looked up
  return fail(errc::launch_failure);
}

DomainState domain_state(int state, int reason) {
  if (state != VIR_DOMAIN_PAUSED) return DomainState::running;
  // Paused by a migration (its last moments, or one that ended without resuming it), or for a
  // reason libvirt does not know (its own recovery after a failed migration resumes those
  // too). A copy still starting up is a destination's, filled by a migration, which libvirt
  // kills if its source goes away: never a guest that runs. Any other pause is someone
  // else's: a user's, an I/O error's.
  switch (reason) {
    case VIR_DOMAIN_PAUSED_MIGRATION:
    case VIR_DOMAIN_PAUSED_STARTING_UP:
    case VIR_DOMAIN_PAUSED_POSTCOPY_FAILED:
    case VIR_DOMAIN_PAUSED_UNKNOWN: return DomainState::paused;
    default: return DomainState::running;
  }
}

// The agent runs on the host its libvirt drives: the kernel's figures are the host's.
result<HostStats> LibvirtBackend::host_stats() { return measure_host_stats(options_.instance_dir); }

result<DomainUsage> LibvirtBackend::usage(const std::string& uuid) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  if (Lookup found = lookup(uuid, dom); found != Lookup::mine) return not_mine(uuid, found, "reading its usage");
  virDomainInfo info{};
  if (api->virDomainGetInfo(dom.ptr, &info) < 0) return fail(errc::launch_failure);
  DomainUsage usage;
  usage.running = info.state == VIR_DOMAIN_RUNNING || info.state == VIR_DOMAIN_BLOCKED ||
                  info.state == VIR_DOMAIN_PAUSED;
  usage.vcpus = info.nrVirtCpu;
  usage.cpu_time_ns = info.cpuTime;
  usage.memory_kib = usage.running ? info.memory : 0;
  if (usage.running) {
    virDomainMemoryStatStruct stats[VIR_DOMAIN_MEMORY_STAT_NR];
    int n = api->virDomainMemoryStats(dom.ptr, stats, VIR_DOMAIN_MEMORY_STAT_NR, 0);
    for (int i = 0; i < n; ++i)
      if (stats[i].tag == VIR_DOMAIN_MEMORY_STAT_RSS) usage.rss_kib = int64_t(stats[i].val);
  }
  virDomainBlockInfo block{};
  if (api->virDomainGetBlockInfo(dom.ptr, "vda", &block, 0) == 0) {
    usage.disk_capacity = int64_t(block.capacity);
    usage.disk_allocation = int64_t(block.allocation);
  }
  usage.simulated = options_.domain_type == "test";
  return usage;
}

result<StopCause> LibvirtBackend::stop_cause(const std::string& uuid) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  if (Lookup found = lookup(uuid, dom); found != Lookup::mine) return not_mine(uuid, found, "reading why it stopped");
  int state = 0, reason = 0;
  if (api->virDomainGetState(dom.ptr, &state, &reason, 0) < 0) return fail(errc::launch_failure);
  if (state == VIR_DOMAIN_CRASHED) return StopCause::crashed;
  if (state != VIR_DOMAIN_SHUTOFF) return StopCause::unknown;
  switch (reason) {
    case VIR_DOMAIN_SHUTOFF_SHUTDOWN: return StopCause::shutdown;
    case VIR_DOMAIN_SHUTOFF_DESTROYED: return StopCause::destroyed;
    case VIR_DOMAIN_SHUTOFF_CRASHED: return StopCause::crashed;
    default: return StopCause::unknown;
  }
}

result<std::vector<GuestAddress>> LibvirtBackend::addresses(const std::string& uuid) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  if (Lookup found = lookup(uuid, dom); found != Lookup::mine) return not_mine(uuid, found, "reading its addresses");
  // dnsmasq's leases on a libvirt network; else the host's neighbour table: on a plain
  // bridge, and on a libvirt network that only bridges (its DHCP server is another's: a second
  // daemon's guests on the first one's network). Read here, not through libvirt's ARP
  // source, which libvirt 9.0 cannot parse on current kernels ("wrong nlmsg len").
  if (options_.bridge.empty()) {
    if (auto leased = leased_addresses(dom.ptr); !leased || !leased->empty()) return leased;
  }
  std::ifstream table("/proc/net/arp");
  const std::string text((std::istreambuf_iterator<char>(table)), std::istreambuf_iterator<char>());
  const std::string mac = instance_mac(uuid);
  std::vector<GuestAddress> found;
  for (std::string& ip : arp_addresses(text, mac)) found.push_back(GuestAddress{mac, std::move(ip)});
  return found;
}

result<std::vector<GuestAddress>> LibvirtBackend::leased_addresses(virDomainPtr dom) {
  virDomainInterfacePtr* interfaces = nullptr;
  int count = api->virDomainInterfaceAddresses(dom, &interfaces, VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0);
  if (count < 0) return fail(errc::network_failure);
  std::vector<GuestAddress> found;
  for (int i = 0; i < count; ++i) {
    virDomainInterfacePtr interface = interfaces[i];
    for (unsigned j = 0; j < interface->naddrs; ++j) {
      if (interface->addrs[j].type == VIR_IP_ADDR_TYPE_IPV4 && interface->addrs[j].addr)
        found.push_back(GuestAddress{interface->hwaddr ? interface->hwaddr : "", interface->addrs[j].addr});
    }
    api->virDomainInterfaceFree(interface);
  }
  free(interfaces);
  return found;
}

result<DomainStates> LibvirtBackend::list() {
  if (!revive()) return unavailable();
  virDomainPtr* domains = nullptr;
  int count = api->virConnectListAllDomains(conn_, &domains, 0);
  if (count < 0) return fail(errc::launch_failure);
  result<DomainStates> listed = DomainStates{};
  char uuid[VIR_UUID_STRING_BUFLEN];
  for (int i = 0; i < count; ++i) {
    const char* name = api->virDomainGetName(domains[i]);
    if (listed && name && api->virDomainGetUUIDString(domains[i], uuid) == 0 && domain_name(uuid) == name &&
        owned(domains[i], uuid).value_or(false)) {  // one that cannot be told is left alone
      // A state libvirt does not tell fails the listing: unknown is not absent.
      auto state = state_of(domains[i]);
      if (!state) listed = state.error();
      else if (*state != DomainState::absent) listed->emplace(uuid, *state);
    }
    api->virDomainFree(domains[i]);
  }
  free(domains);
  return listed;
}

LibvirtBackend::Lookup LibvirtBackend::lookup(const std::string& uuid, DomainHandle& dom) {
  dom.ptr = api->virDomainLookupByUUIDString(conn_, uuid.c_str());
  if (!dom) return last_error_is(VIR_ERR_NO_DOMAIN) ? Lookup::absent : Lookup::failed;
  std::optional<bool> mine = owned(dom.ptr, uuid);
  // Gone between the two calls (moved away, undefined): none.
  if (!mine) return last_error_is(VIR_ERR_NO_DOMAIN) ? Lookup::absent : Lookup::failed;
  return *mine ? Lookup::mine : Lookup::foreign;
}

Error LibvirtBackend::not_mine(const std::string& uuid, Lookup found, std::string_view doing) {
  switch (found) {
    case Lookup::failed: return fail(errc::launch_failure, doing);
    case Lookup::foreign:
      return Error(errc::not_found, fmt::format("{}: the domain of instance {} on libvirt {} belongs to another "
                                                "agent sharing that libvirt", doing, uuid, options_.uri));
    case Lookup::absent:
    case Lookup::mine: break;
  }
  return Error(errc::not_found, fmt::format("{}: instance {} has no domain on libvirt {}", doing, uuid, options_.uri));
}

std::optional<bool> LibvirtBackend::owned(virDomainPtr domain, const std::string& uuid) {
  if (options_.owner.empty()) return true;
  {
    std::lock_guard lock(owners_mutex_);
    if (mine_.count(uuid)) return true;
  }
  char* element = api->virDomainGetMetadata(domain, VIR_DOMAIN_METADATA_ELEMENT, owner_namespace, 0);
  // No element of ours: someone else's. Any other failure says nothing either way.
  if (!element) return last_error_is(VIR_ERR_NO_DOMAIN_METADATA) ? std::optional<bool>(false) : std::nullopt;
  bool mine = owner_in_metadata(element) == options_.owner;
  free(element);
  if (mine) {
    std::lock_guard lock(owners_mutex_);
    mine_.insert(uuid);
  }
  return mine;
}

void LibvirtBackend::forget_owned(const std::string& uuid) {
  std::lock_guard lock(owners_mutex_);
  mine_.erase(uuid);
}

void LibvirtBackend::on_lifecycle(std::function<void(const std::string& uuid, bool started)> changed) {
  {
    std::lock_guard lock(events_mutex_);
    lifecycle_ = std::move(changed);
  }
  watch_lifecycle(conn_.load());
}

void LibvirtBackend::watch_lifecycle(virConnectPtr conn) {
  std::lock_guard lock(events_mutex_);
  if (!lifecycle_) return;
  int id = api->virConnectDomainEventRegisterAny(conn, nullptr, VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                                                 VIR_DOMAIN_EVENT_CALLBACK(&LibvirtBackend::lifecycle_event), this,
                                                 nullptr);
  if (id < 0) {
    spdlog::warn("libvirt {}: no domain events ({}); guests that stop are seen at the next resync", options_.uri,
                 last_virt_error());
    return;
  }
  event_callbacks_.emplace_back(conn, id);
}

int LibvirtBackend::lifecycle_event(virConnectPtr, virDomainPtr domain, int event, int detail, void* opaque) {
  // Defined, resumed and the like change nothing toyvm acts on; a pause may be one a move
  // left (not a migration's own last moments, which its move is busy with).
  const bool paused = event == VIR_DOMAIN_EVENT_SUSPENDED && detail != VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED;
  if (event != VIR_DOMAIN_EVENT_STARTED && event != VIR_DOMAIN_EVENT_STOPPED && event != VIR_DOMAIN_EVENT_CRASHED &&
      event != VIR_DOMAIN_EVENT_UNDEFINED && !paused)
    return 0;
  auto* self = static_cast<LibvirtBackend*>(opaque);
  const char* name = api->virDomainGetName(domain);
  char uuid[VIR_UUID_STRING_BUFLEN];
  if (!name || api->virDomainGetUUIDString(domain, uuid) != 0 || domain_name(uuid) != name) return 0;
  std::function<void(const std::string&, bool)> changed;
  {
    std::lock_guard lock(self->events_mutex_);
    changed = self->lifecycle_;
  }
  if (changed) changed(uuid, event == VIR_DOMAIN_EVENT_STARTED);
  return 0;
}

}  // namespace toyvm::libvirt_impl
