#pragma once
// What the compute agent needs from a hypervisor. Calls block: the agent runs them on its
// worker pool. Implementations: libvirt (virt/libvirt_backend.hpp) and a fake for unit tests.

#include "core/error.hpp"
#include "model/domain.hpp"
#include "model/image.hpp"
#include "model/metadata.hpp"
#include "model/records.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace toyvm {

// What a domain boots, as local files (virt/images.hpp resolves image references into this).
struct BootImage {
  std::string disk;  // base disk under the instance's overlay; empty: none
  DiskFormat disk_format = DiskFormat::raw;
  uint64_t disk_size = 0;  // the base disk's virtual size in bytes
  std::string kernel, initrd, cmdline;  // direct kernel boot when `kernel` is set

  bool operator==(const BootImage&) const = default;
};

struct DomainSpec {
  std::string uuid;  // the instance uuid doubles as the domain uuid
  std::string name;
  int64_t vcpus = 1;
  int64_t memory_mb = 256;
  int64_t disk_gb = 0;
  BootImage image;
  std::string mac;           // the NIC's address; empty: no NIC
  std::string ip;            // the guest's address, when known: its filter lets it send from it at
                             // once (a guest that moved here asks DHCP nothing)
  bool start = true;         // false: defined and left off
  // The files of a read-only config drive (ISO 9660, label config-2); empty: none.
  std::vector<DriveFile> config_drive;
};

// Where a running guest moves: the destination's libvirt (as this host reaches it), the address
// QEMU's migration stream goes to, and the domain as the destination defines it (its paths,
// its owner: VirtBackend::prepare_incoming there).
struct MigrationTarget {
  std::string libvirt_uri;    // e.g. qemu+tcp://host-b/system
  std::string migration_uri;  // e.g. tcp://host-b
  std::string domain_xml;
  // Not completed by then (from the call's start), the move is aborted: timeout.
  std::chrono::milliseconds completion_timeout{std::chrono::hours(24)};
};

// What a live move took, as libvirt tells it.
struct MigrationStats {
  int64_t total_ms = 0;     // the whole move, disk copy included
  int64_t downtime_ms = -1;  // the guest paused at the switch-over (QEMU's figure); -1: unknown
  uint64_t bytes = 0;        // memory and disk sent
};

struct GuestAddress {
  std::string mac;
  std::string ip;
};

// Failures carry a code of the instance error taxonomy (launch_failure, image_failure,
// network_failure), or virt_unavailable: the connection to libvirt is lost, which says
// nothing about the instance.
class VirtBackend {
 public:
  virtual ~VirtBackend() = default;
  // Makes the disk overlay, defines and starts the domain (unless the spec says not to); a
  // domain that already exists is started if needed.
  virtual result<void> create(const DomainSpec& spec) = 0;
  // Makes a defined domain run: started when off, resumed when a move left it paused.
  virtual result<void> start(const std::string& uuid) = 0;
  // Asks the guest to power off (ACPI); stop() pulls the plug.
  virtual result<void> shutdown(const std::string& uuid) = 0;
  virtual result<void> stop(const std::string& uuid) = 0;
  // Stops and undefines, deletes the overlay and the instance's dir; what does not exist is
  // already destroyed.
  virtual result<void> destroy(const std::string& uuid) = 0;
  // The destination's part of a move: the instance's dir, disk overlay (as big, over the same
  // base image; the migration copies the contents) and config drive made here, nothing
  // defined. The domain XML the guest is to have here.
  virtual result<std::string> prepare_incoming(const DomainSpec& spec) = 0;
  // Moves the running guest to another libvirt while it runs, its disk copied along (NBD); once
  // it runs there, its domain is undefined here and its files removed. A move that has not
  // completed within its timeout, or that abort_migration ends, leaves the guest running here:
  // timeout, or cancelled.
  virtual result<MigrationStats> migrate(const std::string& uuid, const MigrationTarget& to) = 0;
  // Ends a migration of the guest that runs now (virDomainAbortJob), from another thread than
  // the one migrating; done when none runs.
  virtual result<void> abort_migration(const std::string& uuid) = 0;
  // A cold move: the guest's disk overlay, its domain shut off here, copied into `disk` (the
  // overlay prepare_incoming made there) on the libvirt at `libvirt_uri`, through libvirt's
  // storage volume streams.
  virtual result<void> send_disk(const std::string& uuid, const std::string& libvirt_uri, const std::string& disk) = 0;
  // The destination's end of it: the copied overlay given this host's base image (the spec's)
  // and size (a resize may grow it), and the domain defined from `domain_xml`, left off. Its work, once here, says its power.
  virtual result<void> receive_disk(const DomainSpec& spec, const std::string& domain_xml) = 0;
  // A resize on this host: the guest, off, given the spec's size (its disk grown to it, its
  // domain defined again with its CPUs and memory).
  virtual result<void> resize_in_place(const DomainSpec& spec) = 0;
  // A move of the guest is under way here: a migration job runs on its domain (the source's),
  // or it is the destination's paused copy still being filled. false when there is no domain,
  // and for a guest a migration left paused with no job (DomainState::paused): libvirt has
  // stopped, and leaves it to toyvm.
  virtual result<bool> migrating(const std::string& uuid) = 0;
  // The configured libvirt network exists and is active (started if it is not).
  virtual result<void> ensure_network() = 0;
  // The DNS servers the guests' network offers (its dnsmasq on a libvirt network); none on a
  // bridge, whose DHCP server says.
  virtual result<std::vector<std::string>> network_dns() = 0;
  // The guest's IPv4 addresses as libvirt knows them (DHCP leases, or ARP on a bridge).
  virtual result<std::vector<GuestAddress>> addresses(const std::string& uuid) = 0;
  virtual result<DomainState> state(const std::string& uuid) = 0;
  virtual result<DomainUsage> usage(const std::string& uuid) = 0;
  // For a shut-off domain: why.
  virtual result<StopCause> stop_cause(const std::string& uuid) = 0;
  // `changed(uuid, started)` is called, on libvirt's event thread, whenever one of this
  // agent's domains starts, stops, crashes, is paused (not by a migration as it ends) or goes
  // away.
  virtual void on_lifecycle(std::function<void(const std::string& uuid, bool started)> changed) = 0;
  // The domains this agent manages, each with its state: named toyvm-<uuid> and, with an
  // owner set, made by that owner (several agents may share one libvirt).
  virtual result<DomainStates> list() = 0;
  // The machine's memory, disk, load and CPUs, as the agent reports them (`stats/` in etcd).
  virtual result<HostStats> host_stats() = 0;
};

struct LibvirtOptions {
  std::string uri = "test:///default";
  std::string domain_type;   // empty: "test" for test:// URIs, "qemu" otherwise
  std::string instance_dir;  // <instance_dir>/<uuid>/ holds an instance's console log and disk
  std::string network;       // libvirt network for guest NICs, e.g. "default"
  std::string bridge;        // or a host bridge (then the network is not used)
  std::string nic_model = "virtio";
  std::string guest_filter = "clean-traffic";  // libvirt nwfilter on each NIC; empty: none
  std::string owner;         // the agent's provider uuid, recorded in each domain it makes
};

// The namespace of toyvm's element in a domain's <metadata>.
inline constexpr const char* owner_namespace = "urn:toyvm:owner:1";

// Where an instance's files live.
std::string instance_path(const std::string& instance_dir, const std::string& uuid);
std::string console_log_path(const std::string& instance_dir, const std::string& uuid);
// The disk overlay, a volume of the agent's storage pool over the instance dir.
std::string overlay_path(const std::string& instance_dir, const std::string& uuid);
std::string config_drive_path(const std::string& instance_dir, const std::string& uuid);
// A stable locally administered MAC address for an instance (52:54:00 is QEMU's prefix).
std::string instance_mac(const std::string& uuid);

result<std::unique_ptr<VirtBackend>> open_libvirt(const LibvirtOptions& options);

// The domain name toyvm gives an instance, and the reverse.
std::string domain_name(const std::string& uuid);
// `disk` is the overlay's path, empty for none; `config_drive` the drive's, empty for none.
std::string domain_xml(const DomainSpec& spec, const LibvirtOptions& options, const std::string& disk,
                       const std::string& config_drive = "");

// The IPv4 addresses a libvirt network's XML gives its host side, where its dnsmasq answers
// DNS; none when its DNS is turned off.
std::vector<std::string> network_dns_addresses(std::string_view network_xml);

}  // namespace toyvm
