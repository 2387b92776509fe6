#include "virt/backend.hpp"

#include "virt/config_drive.hpp"
#include "virt/libvirt_api.hpp"

#include "core/sha256.hpp"
#include "model/uuid.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <set>
#include <system_error>

namespace toyvm {
namespace {

namespace fs = std::filesystem;

const LibvirtApi* api = nullptr;  // set by open_libvirt before any backend exists
thread_local virConnectPtr call_connection = nullptr;  // the connection this thread's call started on

// libvirt keeps one error per thread and clears it at the start of every public call, even a
// successful one: read it right after the call that failed, before any other.
std::string last_virt_error() {
  virErrorPtr error = api->virGetLastError();
  return error && error->message ? error->message : "libvirt failed without saying why";
}

bool last_error_is(int code) {
  virErrorPtr error = api->virGetLastError();
  return error && error->code == code;
}

// Owns one libvirt object pointer and frees it with the matching call.
template <class Ptr, auto Free>
struct Handle {
  Ptr ptr = nullptr;
  explicit Handle(Ptr p) : ptr(p) {}
  ~Handle() {
    if (ptr) (api->*Free)(ptr);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  explicit operator bool() const { return ptr != nullptr; }
};
using DomainHandle = Handle<virDomainPtr, &LibvirtApi::virDomainFree>;
using NetworkHandle = Handle<virNetworkPtr, &LibvirtApi::virNetworkFree>;
using PoolHandle = Handle<virStoragePoolPtr, &LibvirtApi::virStoragePoolFree>;
using VolumeHandle = Handle<virStorageVolPtr, &LibvirtApi::virStorageVolFree>;

std::string xml_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '\'': out += "&apos;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string overlay_name(const std::string& uuid) { return uuid + ".qcow2"; }

class LibvirtBackend final : public VirtBackend {
 public:
  LibvirtBackend(virConnectPtr conn, LibvirtOptions options, std::string pool)
      : conn_(conn), options_(std::move(options)), pool_(std::move(pool)) {}
  ~LibvirtBackend() override {
    // The pool is transient: stopping it forgets it in libvirt and leaves the files alone.
    PoolHandle pool(api->virStoragePoolLookupByName(conn_, pool_.c_str()));
    if (pool) api->virStoragePoolDestroy(pool.ptr);
    for (auto [conn, id] : event_callbacks_) api->virConnectDomainEventDeregisterAny(conn, id);
    api->virConnectClose(conn_);
    for (virConnectPtr dead : retired_) api->virConnectClose(dead);
  }

  // libvirtd may restart under the agent: a connection found dead is replaced by a new one.
  // The dead one is closed with the backend, as calls on other threads may still hold it.
  // Each call notes which connection it started on: a failure on a connection that has been
  // replaced meanwhile is the connection's, not the instance's.
  bool revive() {
    virConnectPtr current = conn_.load();
    call_connection = current;
    if (api->virConnectIsAlive(current) == 1) return true;
    std::lock_guard lock(revive_mutex_);
    call_connection = conn_.load();
    if (call_connection != current) return true;  // another thread did it
    virConnectPtr fresh = api->virConnectOpen(options_.uri.c_str());
    if (!fresh) return false;
    retired_.push_back(current);
    conn_.store(fresh);
    call_connection = fresh;
    watch_lifecycle(fresh);
    spdlog::warn("libvirt {}: the connection was lost; connected again", options_.uri);
    return true;
  }

  VirtResult<bool> create(const DomainSpec& spec) override {
    if (!revive()) return unavailable<bool>();
    // Each step's time, for `-v`: where a build's time goes (the benchmark reads it).
    using clock = std::chrono::steady_clock;
    auto since = [mark = clock::now()]() mutable {
      auto now = clock::now();
      double ms = std::chrono::duration<double, std::milli>(now - mark).count();
      mark = now;
      return ms;
    };
    double disk_ms = 0, define_ms = 0;
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, spec.uuid.c_str()));
    if (!dom) {
      if (!last_error_is(VIR_ERR_NO_DOMAIN)) return fail<bool>("launch_failure");
      if (auto network = ensure_network(); !network) return network;
      std::error_code ec;
      fs::path dir = instance_path(options_.instance_dir, spec.uuid);
      fs::create_directories(dir, ec);
      // QEMU runs as its own user on qemu:///system: it must reach the console log.
      fs::permissions(dir, fs::perms(0755), ec);
      if (ec) return {false, VirtFailure{"launch_failure", fmt::format("cannot create {}: {}", dir.string(), ec.message())}};
      since();
      auto disk = make_overlay(spec);
      if (!disk) return {false, disk.failure};
      std::string drive;
      if (!spec.config_drive.empty()) {
        drive = config_drive_path(options_.instance_dir, spec.uuid);
        std::string why;
        if (!write_config_drive(drive, spec.config_drive, &why)) return {false, VirtFailure{"launch_failure", why}};
      }
      disk_ms = since();
      dom.ptr = api->virDomainDefineXML(conn_, domain_xml(spec, options_, disk.value, drive).c_str());
      if (!dom)
        return fail<bool>(last_error_is(VIR_ERR_NO_NETWORK) ? "network_failure" : "launch_failure",
                          "libvirt refused the domain");
      define_ms = since();
    }
    if (!spec.start) return {true, {}};
    int active = api->virDomainIsActive(dom.ptr);
    if (active == 1) return {true, {}};
    since();
    if (active < 0 || api->virDomainCreate(dom.ptr) < 0) return fail<bool>("launch_failure", "cannot start the domain");
    spdlog::debug("instance {}: disk {:.1f} ms, define {:.1f} ms, start {:.1f} ms", spec.uuid, disk_ms, define_ms,
                  since());
    return {true, {}};
  }

  VirtResult<bool> start(const std::string& uuid) override {
    if (!revive()) return unavailable<bool>();
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
    if (!dom) return fail<bool>("launch_failure");
    if (api->virDomainIsActive(dom.ptr) == 1) return {true, {}};
    if (auto network = ensure_network(); !network) return network;
    if (api->virDomainCreate(dom.ptr) < 0) return fail<bool>("launch_failure", "cannot start the domain");
    return {true, {}};
  }

  VirtResult<bool> shutdown(const std::string& uuid) override {
    return power_off(uuid, api->virDomainShutdown, "shutting down");
  }

  VirtResult<bool> stop(const std::string& uuid) override {
    return power_off(uuid, api->virDomainDestroy, "stopping");
  }

  VirtResult<bool> destroy(const std::string& uuid) override {
    if (!revive()) return unavailable<bool>();
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
    if (!dom && !last_error_is(VIR_ERR_NO_DOMAIN)) return fail<bool>("launch_failure");
    if (dom) {
      if (api->virDomainIsActive(dom.ptr) == 1 && api->virDomainDestroy(dom.ptr) < 0)
        return fail<bool>("launch_failure");
      if (api->virDomainUndefine(dom.ptr) < 0 && !last_error_is(VIR_ERR_NO_DOMAIN))
        return fail<bool>("launch_failure");
    }
    forget_owned(uuid);
    if (auto deleted = delete_overlay(uuid); !deleted) return deleted;
    std::error_code ec;
    fs::remove_all(instance_path(options_.instance_dir, uuid), ec);
    if (ec) return {false, VirtFailure{"launch_failure", "removing the instance dir: " + ec.message()}};
    return {true, {}};
  }

  VirtResult<DomainState> state(const std::string& uuid) override {
    if (!revive()) return unavailable<DomainState>();
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
    if (!dom) {
      if (last_error_is(VIR_ERR_NO_DOMAIN)) return {DomainState::absent, {}};
      return fail<DomainState>("launch_failure");
    }
    int active = api->virDomainIsActive(dom.ptr);
    if (active < 0) return fail<DomainState>("launch_failure");
    return {active == 1 ? DomainState::running : DomainState::stopped, {}};
  }

  VirtResult<DomainUsage> usage(const std::string& uuid) override {
    if (!revive()) return unavailable<DomainUsage>();
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
    if (!dom) return fail<DomainUsage>("launch_failure");
    virDomainInfo info{};
    if (api->virDomainGetInfo(dom.ptr, &info) < 0) return fail<DomainUsage>("launch_failure");
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
    return {usage, {}};
  }

  VirtResult<StopCause> stop_cause(const std::string& uuid) override {
    if (!revive()) return unavailable<StopCause>();
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
    if (!dom) return fail<StopCause>("launch_failure");
    int state = 0, reason = 0;
    if (api->virDomainGetState(dom.ptr, &state, &reason, 0) < 0) return fail<StopCause>("launch_failure");
    if (state == VIR_DOMAIN_CRASHED) return {StopCause::crashed, {}};
    if (state != VIR_DOMAIN_SHUTOFF) return {StopCause::unknown, {}};
    switch (reason) {
      case VIR_DOMAIN_SHUTOFF_SHUTDOWN: return {StopCause::shutdown, {}};
      case VIR_DOMAIN_SHUTOFF_DESTROYED: return {StopCause::destroyed, {}};
      case VIR_DOMAIN_SHUTOFF_CRASHED: return {StopCause::crashed, {}};
      default: return {StopCause::unknown, {}};
    }
  }

  void on_lifecycle(std::function<void(const std::string& uuid, bool started)> changed) override {
    {
      std::lock_guard lock(events_mutex_);
      lifecycle_ = std::move(changed);
    }
    watch_lifecycle(conn_.load());
  }

  VirtResult<std::vector<GuestAddress>> addresses(const std::string& uuid) override {
    if (!revive()) return unavailable<std::vector<GuestAddress>>();
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
    if (!dom) return fail<std::vector<GuestAddress>>("launch_failure");
    // dnsmasq's leases on a libvirt network; the host's ARP table on a plain bridge.
    unsigned source = options_.bridge.empty() ? VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE
                                              : VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP;
    virDomainInterfacePtr* interfaces = nullptr;
    int count = api->virDomainInterfaceAddresses(dom.ptr, &interfaces, source, 0);
    if (count < 0) return fail<std::vector<GuestAddress>>("network_failure");
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
    return {std::move(found), {}};
  }

  VirtResult<std::vector<std::string>> list() override {
    if (!revive()) return unavailable<std::vector<std::string>>();
    virDomainPtr* domains = nullptr;
    int count = api->virConnectListAllDomains(conn_, &domains, 0);
    if (count < 0) return fail<std::vector<std::string>>("launch_failure");
    std::vector<std::string> uuids;
    char uuid[VIR_UUID_STRING_BUFLEN];
    for (int i = 0; i < count; ++i) {
      const char* name = api->virDomainGetName(domains[i]);
      if (name && api->virDomainGetUUIDString(domains[i], uuid) == 0 && domain_name(uuid) == name &&
          owned(domains[i], uuid))
        uuids.emplace_back(uuid);
      api->virDomainFree(domains[i]);
    }
    free(domains);
    return {std::move(uuids), {}};
  }

  VirtResult<std::vector<std::string>> network_dns() override {
    if (!revive()) return unavailable<std::vector<std::string>>();
    if (options_.network.empty() || !options_.bridge.empty()) return {{}, {}};
    NetworkHandle network(api->virNetworkLookupByName(conn_, options_.network.c_str()));
    if (!network) return fail<std::vector<std::string>>("network_failure");
    char* xml = api->virNetworkGetXMLDesc(network.ptr, 0);
    if (!xml) return fail<std::vector<std::string>>("network_failure");
    std::vector<std::string> addresses = network_dns_addresses(xml);
    free(xml);
    return {addresses, {}};
  }

  VirtResult<bool> ensure_network() override {
    if (!revive()) return unavailable<bool>();
    if (options_.network.empty() || !options_.bridge.empty()) return {true, {}};
    NetworkHandle network(api->virNetworkLookupByName(conn_, options_.network.c_str()));
    if (!network) return fail<bool>("network_failure", fmt::format("libvirt network '{}'", options_.network));
    if (api->virNetworkIsActive(network.ptr) == 1 || api->virNetworkCreate(network.ptr) == 0) return {true, {}};
    auto failed = fail<bool>("network_failure", fmt::format("cannot start libvirt network '{}'", options_.network));
    if (api->virNetworkIsActive(network.ptr) == 1) return {true, {}};  // another agent started it
    return failed;
  }

  // The instance storage pool: transient (libvirt forgets it on restart; open_libvirt makes
  // it again), a dir pool over the instance dir.
  VirtResult<bool> ensure_pool() {
    PoolHandle pool(api->virStoragePoolLookupByName(conn_, pool_.c_str()));
    if (pool) return {true, {}};
    std::string xml = fmt::format("<pool type='dir'><name>{}</name><target><path>{}</path></target></pool>",
                                  xml_escape(pool_), xml_escape(options_.instance_dir));
    pool.ptr = api->virStoragePoolCreateXML(conn_, xml.c_str(), 0);
    if (!pool) {
      auto failed = fail<bool>("launch_failure", "cannot make the storage pool");
      PoolHandle made(api->virStoragePoolLookupByName(conn_, pool_.c_str()));  // by another thread meanwhile
      return made ? VirtResult<bool>{true, {}} : failed;
    }
    return {true, {}};
  }

 private:
  // Each connection needs its own registration; libvirt calls back on its event thread.
  void watch_lifecycle(virConnectPtr conn) {
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

  static int lifecycle_event(virConnectPtr, virDomainPtr domain, int event, int, void* opaque) {
    // Defined, suspended, resumed and the like change nothing toyvm acts on.
    if (event != VIR_DOMAIN_EVENT_STARTED && event != VIR_DOMAIN_EVENT_STOPPED && event != VIR_DOMAIN_EVENT_CRASHED &&
        event != VIR_DOMAIN_EVENT_UNDEFINED)
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

  // A failure carrying libvirt's own words, after what toyvm was doing when it has a say. A
  // connection that died meanwhile says nothing about the instance: libvirt_unavailable.
  template <class T>
  VirtResult<T> fail(const char* reason, std::string_view doing = {}) {
    std::string message = doing.empty() ? last_virt_error() : fmt::format("{}: {}", doing, last_virt_error());
    if (call_connection != conn_.load() || api->virConnectIsAlive(conn_.load()) != 1) reason = "libvirt_unavailable";
    return {T{}, VirtFailure{reason, std::move(message)}};
  }

  template <class T>
  VirtResult<T> unavailable() {
    return {T{}, VirtFailure{"libvirt_unavailable", fmt::format("cannot connect to libvirt {} again: {}", options_.uri,
                                                                last_virt_error())}};
  }

  // Whether this agent made the domain, as its metadata says. Its own are remembered until
  // it destroys them; others are asked again, as the uuid may come to this agent later (a
  // build moved here from another agent on the same libvirt).
  bool owned(virDomainPtr domain, const std::string& uuid) {
    if (options_.owner.empty()) return true;
    {
      std::lock_guard lock(owners_mutex_);
      if (mine_.count(uuid)) return true;
    }
    char* element = api->virDomainGetMetadata(domain, VIR_DOMAIN_METADATA_ELEMENT, owner_namespace, 0);
    bool mine = element && std::string_view(element) == "<owner>" + options_.owner + "</owner>";
    free(element);
    if (mine) {
      std::lock_guard lock(owners_mutex_);
      mine_.insert(uuid);
    }
    return mine;
  }

  void forget_owned(const std::string& uuid) {
    std::lock_guard lock(owners_mutex_);
    mine_.erase(uuid);
  }

  VirtResult<bool> power_off(const std::string& uuid, int (*call)(virDomainPtr), const char* doing) {
    if (!revive()) return unavailable<bool>();
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
    if (!dom) return fail<bool>("invalid_data");
    if (api->virDomainIsActive(dom.ptr) != 1 || call(dom.ptr) == 0) return {true, {}};
    auto failed = fail<bool>("launch_failure", doing);
    if (api->virDomainIsActive(dom.ptr) == 0) return {true, {}};  // it went off meanwhile
    return failed;
  }

  // A copy-on-write qcow2 over the base disk (or a blank one), as big as the instance's disk.
  VirtResult<std::string> make_overlay(const DomainSpec& spec) {
    const BootImage& image = spec.image;
    uint64_t wanted = uint64_t(spec.disk_gb) << 30;
    if (image.disk.empty() && wanted == 0) return {"", {}};
    if (!image.disk.empty() && wanted < image.disk_size) {
      if (spec.disk_gb > 0)
        return {"", VirtFailure{"image_failure", fmt::format("the image's disk is {} bytes, larger than the "
                                                            "instance's {} GiB", image.disk_size, spec.disk_gb)}};
      wanted = image.disk_size;
    }
    PoolHandle pool(api->virStoragePoolLookupByName(conn_, pool_.c_str()));
    if (!pool) {
      if (auto made = ensure_pool(); !made) return {"", made.failure};
      pool.ptr = api->virStoragePoolLookupByName(conn_, pool_.c_str());
      if (!pool) return fail<std::string>("launch_failure");
    }
    // A volume left by a build that failed before its domain was defined is made afresh.
    VolumeHandle stale(api->virStorageVolLookupByName(pool.ptr, overlay_name(spec.uuid).c_str()));
    if (stale) api->virStorageVolDelete(stale.ptr, 0);
    std::string backing;
    if (!image.disk.empty())
      backing = fmt::format("<backingStore><path>{}</path><format type='{}'/></backingStore>",
                            xml_escape(image.disk), to_string(image.disk_format));
    std::string xml = fmt::format(
        "<volume><name>{}</name><capacity unit='bytes'>{}</capacity>"
        "<target><format type='qcow2'/><permissions><mode>0600</mode></permissions></target>{}</volume>",
        overlay_name(spec.uuid), wanted, backing);
    VolumeHandle volume(api->virStorageVolCreateXML(pool.ptr, xml.c_str(), 0));
    // No room in the pool is this host's failure, not the image's: another host may do.
    if (!volume) return fail<std::string>("launch_failure", "cannot make the disk overlay");
    char* path = api->virStorageVolGetPath(volume.ptr);
    if (!path) return fail<std::string>("launch_failure");
    std::string result = path;
    free(path);
    return {result, {}};
  }

  VirtResult<bool> delete_overlay(const std::string& uuid) {
    PoolHandle pool(api->virStoragePoolLookupByName(conn_, pool_.c_str()));
    if (!pool) return {true, {}};
    VolumeHandle volume(api->virStorageVolLookupByName(pool.ptr, overlay_name(uuid).c_str()));
    if (!volume) {
      // Made by an earlier run of the agent, before libvirt last saw the pool's contents.
      api->virStoragePoolRefresh(pool.ptr, 0);
      volume.ptr = api->virStorageVolLookupByName(pool.ptr, overlay_name(uuid).c_str());
      if (!volume) return {true, {}};
    }
    if (api->virStorageVolDelete(volume.ptr, 0) < 0) return fail<bool>("launch_failure");
    return {true, {}};
  }

  std::atomic<virConnectPtr> conn_;
  std::mutex revive_mutex_;
  std::vector<virConnectPtr> retired_;
  LibvirtOptions options_;
  std::string pool_;
  std::mutex owners_mutex_;  // list() may run on several worker threads
  std::mutex events_mutex_;  // libvirt's event thread reads what the agent's threads set
  std::function<void(const std::string&, bool)> lifecycle_;
  std::vector<std::pair<virConnectPtr, int>> event_callbacks_;
  std::set<std::string> mine_;
};

}  // namespace

std::string domain_name(const std::string& uuid) { return "toyvm-" + uuid; }

std::string instance_path(const std::string& instance_dir, const std::string& uuid) {
  return instance_dir + "/" + uuid;
}

std::string console_log_path(const std::string& instance_dir, const std::string& uuid) {
  return instance_path(instance_dir, uuid) + "/console.log";
}

std::string config_drive_path(const std::string& instance_dir, const std::string& uuid) {
  return instance_path(instance_dir, uuid) + "/config-drive.iso";
}

std::vector<std::string> network_dns_addresses(std::string_view xml) {
  // libvirt writes its XML itself, attributes in single quotes; only <ip> elements of the
  // network carry an address attribute and, for IPv6, family='ipv6'.
  std::vector<std::string> addresses;
  if (xml.find("<dns enable='no'") != std::string_view::npos) return addresses;
  for (size_t at = xml.find("<ip "); at != std::string_view::npos; at = xml.find("<ip ", at + 1)) {
    std::string_view element = xml.substr(at, xml.find('>', at) - at);
    if (element.find("family='ipv6'") != std::string_view::npos) continue;
    constexpr std::string_view attribute = "address='";
    size_t start = element.find(attribute);
    if (start == std::string_view::npos) continue;
    start += attribute.size();
    size_t end = element.find('\'', start);
    if (end != std::string_view::npos) addresses.emplace_back(element.substr(start, end - start));
  }
  return addresses;
}

std::string instance_mac(const std::string& uuid) {
  std::string digest = sha256_hex(uuid);
  return fmt::format("52:54:00:{}:{}:{}", digest.substr(0, 2), digest.substr(2, 2), digest.substr(4, 2));
}

std::string domain_xml(const DomainSpec& spec, const LibvirtOptions& options, const std::string& disk,
                       const std::string& config_drive) {
  std::string type = options.domain_type.empty() ? "qemu" : options.domain_type;
  std::string boot;
  const BootImage& image = spec.image;
  if (!image.kernel.empty()) {
    boot = fmt::format("<kernel>{}</kernel>", xml_escape(image.kernel));
    if (!image.initrd.empty()) boot += fmt::format("<initrd>{}</initrd>", xml_escape(image.initrd));
    if (!image.cmdline.empty()) boot += fmt::format("<cmdline>{}</cmdline>", xml_escape(image.cmdline));
  } else {
    boot = "<boot dev='hd'/>";
  }
  std::string devices;
  if (!disk.empty())
    devices += fmt::format(
        "    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/>"
        "<source file='{}'/><target dev='vda' bus='virtio'/></disk>\n",
        xml_escape(disk));
  // Read-only, after the root disk so that the guest still sees its root as vda.
  if (!config_drive.empty())
    devices += fmt::format(
        "    <disk type='file' device='disk'><driver name='qemu' type='raw'/>"
        "<source file='{}'/><target dev='vdb' bus='virtio'/><readonly/></disk>\n",
        xml_escape(config_drive));
  if (!spec.mac.empty() && (!options.network.empty() || !options.bridge.empty())) {
    std::string source = options.bridge.empty()
                             ? fmt::format("<interface type='network'><source network='{}'/>", xml_escape(options.network))
                             : fmt::format("<interface type='bridge'><source bridge='{}'/>", xml_escape(options.bridge));
    // The filter lets the guest send only from its own MAC and the address DHCP gave it
    // (learned by libvirt from the lease): it cannot pose as another guest.
    std::string filter;
    if (!options.guest_filter.empty())
      filter = fmt::format("<filterref filter='{}'><parameter name='CTRL_IP_LEARNING' value='dhcp'/></filterref>",
                           xml_escape(options.guest_filter));
    devices += fmt::format("    {}<mac address='{}'/><model type='{}'/>{}</interface>\n", source,
                           xml_escape(spec.mac), xml_escape(options.nic_model), filter);
  }
  if (!options.instance_dir.empty()) {
    std::string log = xml_escape(console_log_path(options.instance_dir, spec.uuid));
    devices += fmt::format("    <serial type='file'><source path='{0}' append='on'/><target port='0'/></serial>\n"
                           "    <console type='file'><source path='{0}' append='on'/><target type='serial' port='0'/></console>\n",
                           log);
  }
  // Who made the domain: agents sharing one libvirt never touch each other's.
  std::string metadata;
  if (!options.owner.empty())
    metadata = fmt::format("  <metadata><toyvm:owner xmlns:toyvm='{}'>{}</toyvm:owner></metadata>\n", owner_namespace,
                           xml_escape(options.owner));
  // SMBIOS says "OpenStack Nova": cloud-init then trusts the metadata service at 169.254.169.254.
  return fmt::format(
      "<domain type='{type}'>\n"
      "  <name>{name}</name>\n"
      "  <uuid>{uuid}</uuid>\n"
      "  <title>{title}</title>\n"
      "  <memory unit='MiB'>{memory}</memory>\n"
      "  <vcpu>{vcpus}</vcpu>\n"
      "{metadata}"
      "  <sysinfo type='smbios'><system>"
      "<entry name='manufacturer'>toyvm</entry><entry name='product'>OpenStack Nova</entry>"
      "<entry name='version'>{version}</entry><entry name='serial'>{uuid}</entry>"
      "<entry name='uuid'>{uuid}</entry><entry name='family'>Virtual Machine</entry></system></sysinfo>\n"
      "  <os><type arch='x86_64'>hvm</type>{boot}<smbios mode='sysinfo'/></os>\n"
      "  <features><acpi/><apic/></features>\n"
      "  <on_poweroff>destroy</on_poweroff>\n"
      "  <on_reboot>restart</on_reboot>\n"
      "  <on_crash>destroy</on_crash>\n"
      "  <devices>\n{devices}  </devices>\n"
      "</domain>\n",
      fmt::arg("type", xml_escape(type)), fmt::arg("name", domain_name(spec.uuid)),
      fmt::arg("uuid", xml_escape(spec.uuid)), fmt::arg("title", xml_escape(spec.name)),
      fmt::arg("memory", spec.memory_mb), fmt::arg("vcpus", spec.vcpus), fmt::arg("version", TOYVM_VERSION),
      fmt::arg("boot", boot), fmt::arg("devices", devices), fmt::arg("metadata", metadata));
}

result<std::unique_ptr<VirtBackend>> open_libvirt(const LibvirtOptions& options, std::string* detail) {
  api = load_libvirt(detail);
  if (!api) return errc::virt_error;
  virConnectPtr conn = api->virConnectOpen(options.uri.c_str());
  if (!conn) {
    if (detail) *detail = fmt::format("cannot open libvirt {}: {}", options.uri, last_virt_error());
    return errc::virt_error;
  }
  LibvirtOptions resolved = options;
  if (resolved.domain_type.empty()) resolved.domain_type = options.uri.starts_with("test:") ? "test" : "qemu";
  // One pool per instance dir, so that agents with different dirs never share one.
  std::string pool = "toyvm-" + sha256_hex(options.instance_dir).substr(0, 12);
  auto backend = std::make_unique<LibvirtBackend>(conn, resolved, pool);
  if (!options.instance_dir.empty()) {
    if (auto made = backend->ensure_pool(); !made) {
      if (detail) *detail = fmt::format("cannot make storage pool {} over {}: {}", pool, options.instance_dir,
                                        made.failure->message);
      return errc::virt_error;
    }
  }
  return std::unique_ptr<VirtBackend>(std::move(backend));
}

}  // namespace toyvm
