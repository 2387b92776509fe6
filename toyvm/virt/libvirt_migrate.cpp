// Moving a guest between two libvirt daemons: the destination prepares its files; for a running
// guest the source's libvirt drives the migration to the destination's itself (peer to peer),
// copying the disk's contents into the prepared overlay over NBD while the guest runs; a guest
// that is off has its overlay copied through the two daemons' storage volume streams.

#include "virt/libvirt_backend.hpp"

#include "model/image.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

namespace toyvm::libvirt_impl {
namespace {

virTypedParameter string_parameter(const char* field, const std::string& value) {
  virTypedParameter parameter{};
  std::strncpy(parameter.field, field, VIR_TYPED_PARAM_FIELD_LENGTH - 1);
  parameter.type = VIR_TYPED_PARAM_STRING;
  parameter.value.s = const_cast<char*>(value.c_str());  // libvirt only reads it
  return parameter;
}

}  // namespace

result<std::string> LibvirtBackend::prepare_incoming(const DomainSpec& spec) {
  if (!revive()) return unavailable();
  // The guest is on this libvirt already: the source's agent shares it (or a stale domain of
  // that uuid is here). A migration to itself would be refused by libvirt at best; files made
  // here for a second copy would boot the guest afresh. The move is refused instead.
  DomainHandle there(nullptr);
  if (Lookup found = lookup(spec.uuid, there); found == Lookup::failed) {
    return fail(errc::launch_failure, "looking for the guest here");
  } else if (found != Lookup::absent) {
    return Error(errc::already_exists,
                 fmt::format("libvirt {} has a domain of instance {} already: its source shares this host's libvirt "
                             "(moves between agents of one libvirt are refused), or a stale copy is there",
                             options_.uri, spec.uuid));
  }
  if (auto network = ensure_network(); !network) return network.error();
  return make_files(spec);
}

// The finished move as the destination's libvirt has it (the source sends its figures along).
MigrationStats LibvirtBackend::completed_migration(const std::string& uuid, const MigrationTarget& to) {
  MigrationStats stats;
  virConnectPtr there = api->virConnectOpen(to.libvirt_uri.c_str());
  if (!there) return stats;
  if (virDomainPtr dom = api->virDomainLookupByUUIDString(there, uuid.c_str())) {
    int type = 0, count = 0;
    virTypedParameterPtr params = nullptr;
    if (api->virDomainGetJobStats(dom, &type, &params, &count, VIR_DOMAIN_JOB_STATS_COMPLETED) == 0) {
      unsigned long long value = 0;
      if (api->virTypedParamsGetULLong(params, count, VIR_DOMAIN_JOB_DOWNTIME, &value) == 1)
        stats.downtime_ms = int64_t(value);
      if (api->virTypedParamsGetULLong(params, count, VIR_DOMAIN_JOB_DATA_PROCESSED, &value) == 1) stats.bytes = value;
      api->virTypedParamsFree(params, count);
    }
    api->virDomainFree(dom);
  }
  api->virConnectClose(there);
  return stats;
}

result<MigrationStats> LibvirtBackend::migrate(const std::string& uuid, const MigrationTarget& to) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  if (Lookup found = lookup(uuid, dom); found != Lookup::mine) return not_mine(uuid, found, "migrating it");
  virTypedParameter parameters[] = {string_parameter(VIR_MIGRATE_PARAM_URI, to.migration_uri),
                                    string_parameter(VIR_MIGRATE_PARAM_DEST_XML, to.domain_xml),
                                    string_parameter(VIR_MIGRATE_PARAM_PERSIST_XML, to.domain_xml)};
  // Live, defined there and undefined here once it runs there. Only the overlay's own blocks
  // are copied (incremental: the destination's overlay lies over its copy of the same base); a
  // full copy would write the whole disk, zeros included, into that overlay.
  const unsigned flags = VIR_MIGRATE_LIVE | VIR_MIGRATE_PEER2PEER | VIR_MIGRATE_PERSIST_DEST |
                         VIR_MIGRATE_UNDEFINE_SOURCE | VIR_MIGRATE_NON_SHARED_INC;
  {
    std::lock_guard lock(aborts_mutex_);
    if (aborted_.erase(uuid)) return Error(errc::cancelled, "it was aborted before it began");
  }
  const auto started = std::chrono::steady_clock::now();
  // A move that does not converge (a guest dirtying its memory faster than the link carries
  // it) is ended at its deadline by a watchdog; libvirt then leaves the guest running here.
  std::mutex watch;
  std::condition_variable ended;
  bool finished = false, timed_out = false;
  std::thread watchdog([&] {
    std::unique_lock lock(watch);
    if (ended.wait_for(lock, to.completion_timeout, [&] { return finished; })) return;
    timed_out = true;
    lock.unlock();
    api->virDomainAbortJob(dom.ptr);
  });
  const int migrated = api->virDomainMigrateToURI3(dom.ptr, to.libvirt_uri.c_str(), parameters, 3, flags);
  // A driver that cannot migrate at all, a CPU or configuration the destination cannot run and
  // credentials it refuses never will; anything else (a daemon that has just started and not
  // yet probed QEMU, a peer out of reach) may take the guest a moment later.
  const bool never = migrated < 0 && (last_error_is(VIR_ERR_NO_SUPPORT) || last_error_is(VIR_ERR_ARGUMENT_UNSUPPORTED) ||
                                      last_error_is(VIR_ERR_CPU_INCOMPATIBLE) ||
                                      last_error_is(VIR_ERR_CONFIG_UNSUPPORTED) || last_error_is(VIR_ERR_AUTH_FAILED));
  const std::string why = migrated < 0 ? last_virt_error() : "";
  {
    std::lock_guard lock(watch);
    finished = true;
  }
  ended.notify_all();
  watchdog.join();
  bool asked_to_abort = false;
  {
    std::lock_guard lock(aborts_mutex_);
    asked_to_abort = aborted_.erase(uuid) > 0;
  }
  if (migrated < 0) {
    if (timed_out)
      return Error(errc::timeout, fmt::format("it did not complete within {} s (live_migration_completion_timeout) "
                                              "and was aborted: {}",
                                              std::chrono::duration_cast<std::chrono::seconds>(to.completion_timeout).count(),
                                              why));
    if (asked_to_abort) return Error(errc::cancelled, "it was aborted: " + why);
    return fail(never ? errc::launch_failure : errc::not_ready, "migrating to " + to.libvirt_uri);
  }
  const auto took = std::chrono::steady_clock::now() - started;
  forget_owned(uuid);
  if (auto removed = remove_files(uuid); !removed)
    spdlog::warn("instance {}: moved, but its files here remain: {}", uuid, removed.error().message());
  MigrationStats stats = completed_migration(uuid, to);
  stats.total_ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  return stats;
}

namespace {

// Another host's libvirt, for as long as one call needs it.
struct RemoteConnection {
  virConnectPtr ptr;
  explicit RemoteConnection(const std::string& uri) : ptr(api->virConnectOpen(uri.c_str())) {}
  ~RemoteConnection() {
    if (ptr) api->virConnectClose(ptr);
  }
  RemoteConnection(const RemoteConnection&) = delete;
  RemoteConnection& operator=(const RemoteConnection&) = delete;
};

// A stream from one daemon to the other; aborted unless finished.
struct Stream {
  virStreamPtr ptr;
  bool finished = false;
  explicit Stream(virConnectPtr conn) : ptr(api->virStreamNew(conn, 0)) {}
  ~Stream() {
    if (!ptr) return;
    if (!finished) api->virStreamAbort(ptr);
    api->virStreamFree(ptr);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

}  // namespace

result<void> LibvirtBackend::send_disk(const std::string& uuid, const std::string& libvirt_uri,
                                       const std::string& disk) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  if (Lookup found = lookup(uuid, dom); found != Lookup::mine) return not_mine(uuid, found, "copying its disk");
  // A running guest writes its disk: copied only while it is off.
  if (api->virDomainIsActive(dom.ptr) != 0) return Error(errc::launch_failure, "its guest is not off");
  auto found = overlay_volume(uuid);
  if (!found) return found.error();
  VolumeHandle from(*found);
  RemoteConnection there(libvirt_uri);
  if (!there.ptr) return Error(errc::launch_failure, fmt::format("cannot reach {}: {}", libvirt_uri, last_virt_error()));
  VolumeHandle to(api->virStorageVolLookupByPath(there.ptr, disk.c_str()));
  if (!to) return Error(errc::launch_failure, fmt::format("no volume {} there: {}", disk, last_virt_error()));
  Stream in(conn_), out(there.ptr);
  if (!in.ptr || !out.ptr) return Error(errc::launch_failure, "cannot open streams: " + last_virt_error());
  if (api->virStorageVolDownload(from.ptr, in.ptr, 0, 0, 0) < 0) return fail(errc::launch_failure, "reading the disk");
  if (api->virStorageVolUpload(to.ptr, out.ptr, 0, 0, 0) < 0)
    return Error(errc::launch_failure, "writing the disk there: " + last_virt_error());
  std::vector<char> buffer(size_t(1) << 20);
  uint64_t copied = 0;
  for (;;) {
    const int got = api->virStreamRecv(in.ptr, buffer.data(), buffer.size());
    if (got < 0) return fail(errc::launch_failure, "reading the disk");
    if (got == 0) break;
    for (int sent = 0; sent < got;) {
      const int put = api->virStreamSend(out.ptr, buffer.data() + sent, size_t(got - sent));
      if (put < 0) return Error(errc::launch_failure, "writing the disk there: " + last_virt_error());
      sent += put;
    }
    copied += uint64_t(got);
  }
  if (api->virStreamFinish(in.ptr) < 0) return fail(errc::launch_failure, "reading the disk");
  in.finished = true;
  if (api->virStreamFinish(out.ptr) < 0) return Error(errc::launch_failure, "writing the disk there: " + last_virt_error());
  out.finished = true;
  spdlog::info("instance {}: its disk ({} MiB) copied to {}", uuid, copied >> 20, libvirt_uri);
  return {};
}

result<void> LibvirtBackend::receive_disk(const DomainSpec& spec, const std::string& domain_xml) {
  if (!revive()) return unavailable();
  // The overlay names its base as the source has it: this host's, from now on.
  if (!spec.image.disk.empty()) {
    const std::string path = overlay_path(options_.instance_dir, spec.uuid);
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    std::string header(size_t(64) << 10, '\0');
    file.read(header.data(), std::streamsize(header.size()));
    header.resize(size_t(file.gcount()));
    if (!file.eof() && !file.good()) return Error(errc::launch_failure, "cannot read the copied disk " + path);
    auto rebased = rebase_overlay_header(header, spec.image.disk);
    if (!rebased) return Error(errc::launch_failure, rebased.error().message());
    file.clear();
    file.seekp(0);
    file.write(rebased->data(), std::streamsize(rebased->size()));
    file.flush();
    if (!file) return Error(errc::launch_failure, "cannot write the copied disk " + path);
  }
  if (auto grown = grow_overlay(spec); !grown) return grown;
  DomainHandle dom(api->virDomainDefineXML(conn_, domain_xml.c_str()));
  if (!dom) return fail(errc::launch_failure, "libvirt refused the domain");
  return {};
}

result<void> LibvirtBackend::grow_overlay(const DomainSpec& spec) {
  const uint64_t wanted = uint64_t(spec.disk_gb) << 30;
  if (wanted == 0) return {};  // the image's own size, which does not change
  auto found = overlay_volume(spec.uuid);
  if (!found) return found.error();
  VolumeHandle volume(*found);
  // Asked only to grow: libvirt refuses a "resize" to the same capacity of a disk whose file
  // holds more than that (a fully written qcow2 has its metadata on top).
  virStorageVolInfo info{};
  if (api->virStorageVolGetInfo(volume.ptr, &info) < 0) return fail(errc::launch_failure, "reading its disk's size");
  if (info.capacity >= wanted) return {};
  if (api->virStorageVolResize(volume.ptr, wanted, 0) < 0) return fail(errc::launch_failure, "growing its disk");
  return {};
}

result<void> LibvirtBackend::resize_in_place(const DomainSpec& spec) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  if (Lookup found = lookup(spec.uuid, dom); found != Lookup::mine) return not_mine(spec.uuid, found, "resizing it");
  if (api->virDomainIsActive(dom.ptr) != 0) return Error(errc::launch_failure, "its guest is not off");
  if (auto grown = grow_overlay(spec); !grown) return grown;
  const bool has_disk = !spec.image.disk.empty() || spec.disk_gb > 0;
  const std::string disk = has_disk ? overlay_path(options_.instance_dir, spec.uuid) : "";
  const std::string drive = spec.config_drive.empty() ? "" : config_drive_path(options_.instance_dir, spec.uuid);
  const std::string xml = domain_xml(spec, options_, disk, drive);
  DomainHandle redefined(api->virDomainDefineXML(conn_, xml.c_str()));
  if (!redefined) return fail(errc::launch_failure, "libvirt refused the resized domain");
  return {};
}

result<void> LibvirtBackend::abort_migration(const std::string& uuid) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  if (Lookup found = lookup(uuid, dom); found == Lookup::absent || found == Lookup::foreign) {
    return {};  // nothing of this agent's to abort
  } else if (found == Lookup::failed) {
    return fail(errc::launch_failure, "looking for its migration");
  }
  {
    std::lock_guard lock(aborts_mutex_);
    aborted_.insert(uuid);
  }
  if (api->virDomainAbortJob(dom.ptr) == 0) return {};
  // No job runs (it ended, or has not begun): nothing to abort.
  if (last_error_is(VIR_ERR_OPERATION_INVALID)) return {};
  return fail(errc::launch_failure, "aborting its migration");
}

result<bool> LibvirtBackend::migrating(const std::string& uuid) {
  if (!revive()) return unavailable();
  DomainHandle dom(nullptr);
  switch (lookup(uuid, dom)) {
    case Lookup::absent:
    case Lookup::foreign: return false;  // no domain of this agent's
    case Lookup::failed: return fail(errc::launch_failure);
    case Lookup::mine: break;
  }
  // Readable job information is the answer; the destination's copy has none to read while it
  // is being filled, and says so by its state.
  virDomainJobInfo job{};
  if (api->virDomainGetJobInfo(dom.ptr, &job) == 0) return job_runs(job);
  int state = 0, reason = 0;
  if (api->virDomainGetState(dom.ptr, &state, &reason, 0) < 0) return fail(errc::launch_failure);
  return state == VIR_DOMAIN_PAUSED && (reason == VIR_DOMAIN_PAUSED_MIGRATION || reason == VIR_DOMAIN_PAUSED_STARTING_UP ||
                                        reason == VIR_DOMAIN_PAUSED_POSTCOPY);
}

}  // namespace toyvm::libvirt_impl
