// The libvirt backend's changes to domains: the connection and its revival, creating,
// starting, powering off and destroying domains, with their disk overlays, storage pool and
// network. What it reads of them is in virt/libvirt_observe.cpp.

#include "virt/libvirt_backend.hpp"

#include "core/sha256.hpp"
#include "virt/config_drive.hpp"
#include "virt/libvirt_xml.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <system_error>

namespace toyvm {
namespace libvirt_impl {

namespace fs = std::filesystem;

std::string last_virt_error() {
  virErrorPtr error = api->virGetLastError();
  return error && error->message ? error->message : "libvirt failed without saying why";
}

bool last_error_is(int code) {
  virErrorPtr error = api->virGetLastError();
  return error && error->code == code;
}

LibvirtBackend::~LibvirtBackend() {
  // The pool is transient: stopping it forgets it in libvirt and leaves the files alone.
  PoolHandle pool(api->virStoragePoolLookupByName(conn_, pool_.c_str()));
  if (pool) api->virStoragePoolDestroy(pool.ptr);
  for (auto [conn, id] : event_callbacks_) api->virConnectDomainEventDeregisterAny(conn, id);
  api->virConnectClose(conn_);
  for (virConnectPtr dead : retired_) api->virConnectClose(dead);
}

bool LibvirtBackend::revive() {
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

result<void> LibvirtBackend::create(const DomainSpec& spec) {
  if (!revive()) return unavailable();
  // Each step's time, for `-v`: where a build's time goes (the benchmark reads it).
  using clock = std::chrono::steady_clock;
  auto since = [mark = clock::now()]() mutable {
    auto now = clock::now();
    double ms = std::chrono::duration<double, std::milli>(now - mark).count();
    mark = now;
    return ms;
  };
  double disk_ms = 0, define_ms = 0;
  DomainHandle dom(nullptr);
  const Lookup found = lookup(spec.uuid, dom);
  if (found == Lookup::failed) return fail(errc::launch_failure);
  // Defining it would take over another agent's guest (libvirt redefines a domain of that
  // uuid): never done.
  if (found == Lookup::foreign)
    return Error(errc::already_exists, fmt::format("a domain of instance {} on libvirt {} belongs to another agent "
                                                   "sharing that libvirt", spec.uuid, options_.uri));
  if (!dom) {
    if (auto network = ensure_network(); !network) return network;
    since();
    auto xml = make_files(spec);
    if (!xml) return xml.error();
    disk_ms = since();
    dom.ptr = api->virDomainDefineXML(conn_, xml->c_str());
    if (!dom)
      return fail(last_error_is(VIR_ERR_NO_NETWORK) ? errc::network_failure : errc::launch_failure,
                        "libvirt refused the domain");
    define_ms = since();
  }
  if (!spec.start) return {};
  int active = api->virDomainIsActive(dom.ptr);
  if (active == 1) return {};
  since();
  if (active < 0 || api->virDomainCreate(dom.ptr) < 0) return fail(errc::launch_failure, "cannot start the domain");
  spdlog::debug("instance {}: disk {:.1f} ms, define {:.1f} ms, start {:.1f} ms", spec.uuid, disk_ms, define_ms,
                since());
  return {};
}

result<std::string> LibvirtBackend::make_files(const DomainSpec& spec) {
  std::error_code ec;
  fs::path dir = instance_path(options_.instance_dir, spec.uuid);
  fs::create_directories(dir, ec);
  // QEMU runs as its own user on qemu:///system: it must reach the console log.
  fs::permissions(dir, fs::perms(0755), ec);
  if (ec) return Error(errc::launch_failure, fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  auto disk = make_overlay(spec);
  if (!disk) return disk.error();
  std::string drive;
  if (!spec.config_drive.empty()) {
    drive = config_drive_path(options_.instance_dir, spec.uuid);
    if (auto written = write_config_drive(drive, spec.config_drive); !written) return written.error();
  }
  return domain_xml(spec, options_, *disk, drive);
}

result<void> LibvirtBackend::start(const std::string& uuid) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  if (Lookup found = lookup(uuid, dom); found != Lookup::mine) return not_mine(uuid, found, "starting it");
  auto now = state_of(dom.ptr);
  if (!now) return now.error();
  if (*now == DomainState::paused) return resume(dom.ptr, uuid);
  if (*now == DomainState::running) return {};
  if (auto network = ensure_network(); !network) return network;
  if (api->virDomainCreate(dom.ptr) < 0) return fail(errc::launch_failure, "cannot start the domain");
  return {};
}

result<void> LibvirtBackend::resume(virDomainPtr dom, const std::string& uuid) {
  spdlog::warn("instance {}: its guest was left paused (by a move, or for a reason libvirt does not know); "
               "resuming it", uuid);
  if (api->virDomainResume(dom) == 0) return {};
  auto refused = fail(errc::launch_failure, "resuming it");
  if (refused == errc::virt_unavailable) return refused;
  // A job of libvirt's may hold it still: asked again later, never pulled from under it.
  virDomainJobInfo job{};
  if (api->virDomainGetJobInfo(dom, &job) < 0 || job_runs(job)) return refused;
  spdlog::error("instance {}: {}; restarting it", uuid, refused.message());
  if (api->virDomainDestroy(dom) < 0 && api->virDomainIsActive(dom) != 0) return fail(errc::launch_failure, "stopping it");
  if (auto network = ensure_network(); !network) return network;
  if (api->virDomainCreate(dom) < 0) return fail(errc::launch_failure, "cannot start the domain");
  return {};
}

result<void> LibvirtBackend::shutdown(const std::string& uuid) {
  return power_off(uuid, api->virDomainShutdown, "shutting down");
}

result<void> LibvirtBackend::stop(const std::string& uuid) {
  return power_off(uuid, api->virDomainDestroy, "stopping");
}

result<void> LibvirtBackend::destroy(const std::string& uuid) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  const Lookup found = lookup(uuid, dom);
  if (found == Lookup::failed) return fail(errc::launch_failure);
  // Another agent's domain of that uuid is left alone; only this agent's files go.
  if (found == Lookup::mine) {
    if (api->virDomainIsActive(dom.ptr) == 1 && api->virDomainDestroy(dom.ptr) < 0)
      return fail(errc::launch_failure);
    if (api->virDomainUndefine(dom.ptr) < 0 && !last_error_is(VIR_ERR_NO_DOMAIN))
      return fail(errc::launch_failure);
  }
  forget_owned(uuid);
  return remove_files(uuid);
}

result<void> LibvirtBackend::remove_files(const std::string& uuid) {
  if (auto deleted = delete_overlay(uuid); !deleted) return deleted;
  std::error_code ec;
  fs::remove_all(instance_path(options_.instance_dir, uuid), ec);
  if (ec) return Error(errc::launch_failure, "removing the instance dir: " + ec.message());
  return {};
}

result<void> LibvirtBackend::power_off(const std::string& uuid, int (*call)(virDomainPtr), const char* doing) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  if (Lookup found = lookup(uuid, dom); found != Lookup::mine) return not_mine(uuid, found, doing);
  if (api->virDomainIsActive(dom.ptr) != 1 || call(dom.ptr) == 0) return {};
  auto failed = fail(errc::launch_failure, doing);
  if (api->virDomainIsActive(dom.ptr) == 0) return {};  // it went off meanwhile
  return failed;
}

result<std::string> LibvirtBackend::make_overlay(const DomainSpec& spec) {
  const BootImage& image = spec.image;
  uint64_t wanted = uint64_t(spec.disk_gb) << 30;
  if (image.disk.empty() && wanted == 0) return std::string();
  if (!image.disk.empty() && wanted < image.disk_size) {
    if (spec.disk_gb > 0)
      return Error(errc::image_failure, fmt::format("the image's disk is {} bytes, larger than the instance's {} GiB",
                                                    image.disk_size, spec.disk_gb));
    wanted = image.disk_size;
  }
  PoolHandle pool(api->virStoragePoolLookupByName(conn_, pool_.c_str()));
  if (!pool) {
    if (auto made = ensure_pool(); !made) return made.error();
    pool.ptr = api->virStoragePoolLookupByName(conn_, pool_.c_str());
    if (!pool) return fail(errc::launch_failure);
  }
  // A volume left by a build that failed before its domain was defined is made afresh.
  VolumeHandle stale(api->virStorageVolLookupByName(pool.ptr, overlay_name(spec.uuid).c_str()));
  if (stale) api->virStorageVolDelete(stale.ptr, 0);
  const std::string xml = overlay_volume_xml(spec.uuid, wanted, image);
  VolumeHandle volume(api->virStorageVolCreateXML(pool.ptr, xml.c_str(), 0));
  // No room in the pool is this host's failure, not the image's: another host may do.
  if (!volume) return fail(errc::launch_failure, "cannot make the disk overlay");
  char* path = api->virStorageVolGetPath(volume.ptr);
  if (!path) return fail(errc::launch_failure);
  std::string made = path;
  free(path);
  return made;
}

result<virStorageVolPtr> LibvirtBackend::overlay_volume(const std::string& uuid) {
  PoolHandle pool(api->virStoragePoolLookupByName(conn_, pool_.c_str()));
  if (!pool) return Error(errc::not_found, "no storage pool");
  virStorageVolPtr volume = api->virStorageVolLookupByName(pool.ptr, overlay_name(uuid).c_str());
  if (!volume) {
    // Made by an earlier run of the agent, before libvirt last saw the pool's contents.
    api->virStoragePoolRefresh(pool.ptr, 0);
    volume = api->virStorageVolLookupByName(pool.ptr, overlay_name(uuid).c_str());
    if (!volume) return Error(errc::not_found, "no disk overlay");
  }
  return volume;
}

result<void> LibvirtBackend::delete_overlay(const std::string& uuid) {
  auto found = overlay_volume(uuid);
  if (!found) return {};
  VolumeHandle volume(*found);
  if (api->virStorageVolDelete(volume.ptr, 0) < 0) return fail(errc::launch_failure);
  return {};
}

result<void> LibvirtBackend::ensure_pool() {
  PoolHandle pool(api->virStoragePoolLookupByName(conn_, pool_.c_str()));
  if (pool) return {};
  const std::string xml = storage_pool_xml(pool_, options_.instance_dir);
  pool.ptr = api->virStoragePoolCreateXML(conn_, xml.c_str(), 0);
  if (!pool) {
    auto failed = fail(errc::launch_failure, "cannot make the storage pool");
    PoolHandle made(api->virStoragePoolLookupByName(conn_, pool_.c_str()));  // by another thread meanwhile
    if (made) return {};
    return failed;
  }
  return {};
}

result<void> LibvirtBackend::ensure_network() {
  if (!revive()) return unavailable();
  if (options_.network.empty() || !options_.bridge.empty()) return {};
  NetworkHandle network(api->virNetworkLookupByName(conn_, options_.network.c_str()));
  if (!network) return fail(errc::network_failure, fmt::format("libvirt network '{}'", options_.network));
  if (api->virNetworkIsActive(network.ptr) == 1 || api->virNetworkCreate(network.ptr) == 0) return {};
  auto failed = fail(errc::network_failure, fmt::format("cannot start libvirt network '{}'", options_.network));
  if (api->virNetworkIsActive(network.ptr) == 1) return {};  // another agent started it
  return failed;
}

result<std::vector<std::string>> LibvirtBackend::network_dns() {
  if (!revive()) return unavailable();
  if (options_.network.empty() || !options_.bridge.empty()) return std::vector<std::string>();
  NetworkHandle network(api->virNetworkLookupByName(conn_, options_.network.c_str()));
  if (!network) return fail(errc::network_failure);
  char* xml = api->virNetworkGetXMLDesc(network.ptr, 0);
  if (!xml) return fail(errc::network_failure);
  std::vector<std::string> addresses = network_dns_addresses(xml);
  free(xml);
  return addresses;
}

}  // namespace libvirt_impl

result<std::unique_ptr<VirtBackend>> open_libvirt(const LibvirtOptions& options) {
  using namespace libvirt_impl;
  auto loaded = load_libvirt();
  if (!loaded) return loaded.error();
  api = *loaded;
  virConnectPtr conn = api->virConnectOpen(options.uri.c_str());
  if (!conn)
    return Error(errc::virt_unavailable, fmt::format("cannot open libvirt {}: {}", options.uri, last_virt_error()));
  LibvirtOptions resolved = options;
  if (resolved.domain_type.empty()) resolved.domain_type = options.uri.starts_with("test:") ? "test" : "qemu";
  // One pool per instance dir, so that agents with different dirs never share one.
  std::string pool = "toyvm-" + sha256_hex(options.instance_dir).substr(0, 12);
  auto backend = std::make_unique<LibvirtBackend>(conn, resolved, pool);
  if (!options.instance_dir.empty()) {
    if (auto made = backend->ensure_pool(); !made)
      return made.error().doing(fmt::format("cannot make storage pool {} over {}", pool, options.instance_dir));
  }
  return std::unique_ptr<VirtBackend>(std::move(backend));
}

}  // namespace toyvm
