#pragma once
// The libvirt backend's class, shared by its two halves: virt/libvirt_backend.cpp changes
// domains (lifecycle, disks, network), virt/libvirt_observe.cpp reads them (state, usage,
// addresses, the domains an agent owns, lifecycle events). Others include virt/backend.hpp.

#include "virt/backend.hpp"
#include "virt/libvirt_api.hpp"

#include <fmt/format.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toyvm::libvirt_impl {

inline const LibvirtApi* api = nullptr;  // set by open_libvirt before any backend exists
inline thread_local virConnectPtr call_connection = nullptr;  // the connection this thread's call started on

// libvirt keeps one error per thread and clears it at the start of every public call, even a
// successful one: read it right after the call that failed, before any other.
std::string last_virt_error();
bool last_error_is(int code);

// An active domain's state as the model knows it, from libvirt's state and reason.
DomainState domain_state(int state, int reason);

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

class LibvirtBackend final : public VirtBackend {
 public:
  LibvirtBackend(virConnectPtr conn, LibvirtOptions options, std::string pool)
      : conn_(conn), options_(std::move(options)), pool_(std::move(pool)) {}
  ~LibvirtBackend() override;

  result<void> create(const DomainSpec& spec) override;
  result<void> start(const std::string& uuid) override;
  result<void> shutdown(const std::string& uuid) override;
  result<void> stop(const std::string& uuid) override;
  result<void> destroy(const std::string& uuid) override;
  result<DomainState> state(const std::string& uuid) override;
  result<DomainUsage> usage(const std::string& uuid) override;
  result<HostStats> host_stats() override;
  result<StopCause> stop_cause(const std::string& uuid) override;
  void on_lifecycle(std::function<void(const std::string& uuid, bool started)> changed) override;
  result<std::vector<GuestAddress>> addresses(const std::string& uuid) override;
  result<DomainStates> list() override;
  result<std::vector<std::string>> network_dns() override;
  result<void> ensure_network() override;
  result<std::string> prepare_incoming(const DomainSpec& spec) override;
  result<bool> migrating(const std::string& uuid) override;
  result<MigrationStats> migrate(const std::string& uuid, const MigrationTarget& to) override;
  result<void> abort_migration(const std::string& uuid) override;
  result<void> send_disk(const std::string& uuid, const std::string& libvirt_uri, const std::string& disk) override;
  result<void> receive_disk(const DomainSpec& spec, const std::string& domain_xml) override;
  result<void> resize_in_place(const DomainSpec& spec) override;

  // The instance storage pool: transient (libvirt forgets it on restart; open_libvirt makes
  // it again), a dir pool over the instance dir.
  result<void> ensure_pool();

 private:
  // libvirtd may restart under the agent: a connection found dead is replaced by a new one.
  // The dead one is closed with the backend, as calls on other threads may still hold it.
  // Each call notes which connection it started on: a failure on a connection that has been
  // replaced meanwhile is the connection's, not the instance's.
  bool revive();

  // Each connection needs its own registration; libvirt calls back on its event thread.
  void watch_lifecycle(virConnectPtr conn);
  static int lifecycle_event(virConnectPtr, virDomainPtr domain, int event, int detail, void* opaque);

  // A failure carrying libvirt's own words, after what toyvm was doing when it has a say. A
  // connection that died meanwhile says nothing about the instance: virt_unavailable.
  Error fail(errc reason, std::string_view doing = {}) {
    std::string message = doing.empty() ? last_virt_error() : fmt::format("{}: {}", doing, last_virt_error());
    if (call_connection != conn_.load() || api->virConnectIsAlive(conn_.load()) != 1) reason = errc::virt_unavailable;
    return Error(reason, std::move(message));
  }

  Error unavailable() {
    return Error(errc::virt_unavailable,
                 fmt::format("cannot connect to libvirt {} again: {}", options_.uri, last_virt_error()));
  }

  // The domain of `uuid` in `dom`, when it is this agent's. Every lookup by uuid goes through
  // here: several agents may share one libvirt, and one must never act on another's guest.
  enum class Lookup { mine, absent, foreign, failed };  // failed: libvirt's error is the last one
  Lookup lookup(const std::string& uuid, DomainHandle& dom);
  // The error for a call on a domain that is not this agent's: not_found, saying whose it is.
  Error not_mine(const std::string& uuid, Lookup found, std::string_view doing);

  // Whether this agent made the domain, as its metadata says. Its own are remembered until
  // it destroys them; others are asked again, as the uuid may come to this agent later (a
  // build moved here from another agent on the same libvirt).
  // Nothing when libvirt cannot say.
  std::optional<bool> owned(virDomainPtr domain, const std::string& uuid);
  void forget_owned(const std::string& uuid);

  result<void> power_off(const std::string& uuid, int (*call)(virDomainPtr), const char* doing);
  // A job runs on the domain. libvirt goes on reporting one that ended (completed, failed,
  // cancelled) as its current job: a send it could not finish reads "failed" for good.
  static bool job_runs(const virDomainJobInfo& job) {
    return job.type == VIR_DOMAIN_JOB_BOUNDED || job.type == VIR_DOMAIN_JOB_UNBOUNDED;
  }
  // The state of a domain of this agent's (DomainState::paused: a move left it paused).
  result<DomainState> state_of(virDomainPtr dom);
  // Its guest running again after a move left it paused; restarted when libvirt cannot
  // resume it (it tried already, as the move failed) and no job of libvirt's holds it.
  result<void> resume(virDomainPtr dom, const std::string& uuid);
  // A copy-on-write qcow2 over the base disk (or a blank one), as big as the instance's disk.
  result<std::string> make_overlay(const DomainSpec& spec);
  // The instance's dir, overlay and config drive; the domain's XML over them.
  result<std::string> make_files(const DomainSpec& spec);
  // Its overlay and its dir removed: the domain is gone (destroyed, or moved away).
  result<void> remove_files(const std::string& uuid);
  MigrationStats completed_migration(const std::string& uuid, const MigrationTarget& to);
  // The domain's IPv4 addresses in its libvirt network's DHCP leases.
  result<std::vector<GuestAddress>> leased_addresses(virDomainPtr dom);
  result<void> delete_overlay(const std::string& uuid);
  // The instance's overlay as a volume of this agent's pool (refreshed if libvirt has not seen
  // it yet); not_found when there is none.
  result<virStorageVolPtr> overlay_volume(const std::string& uuid);
  // The overlay grown to the spec's disk size (as big already: unchanged).
  result<void> grow_overlay(const DomainSpec& spec);

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
  std::mutex aborts_mutex_;
  std::set<std::string> aborted_;  // migrations abort_migration ended, until migrate() says so
};

}  // namespace toyvm::libvirt_impl
