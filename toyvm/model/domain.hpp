#pragma once
// What the model knows of a domain, as a hypervisor reports it (virt/backend.hpp fills these
// in): its state, why it stopped, what it uses.

#include <cstdint>
#include <map>
#include <string>

namespace toyvm {

// paused: its vCPUs stopped by a migration: in its last moments, or one that ended without
// resuming it, which libvirt leaves to whoever asked for the move (its daemon died between
// sending the guest and hearing whether the destination runs it, or it could not resume the
// guest after a failed send); or for a reason libvirt does not know. A guest paused by anyone
// else (virsh suspend, an I/O error) counts as running: theirs to resume.
enum class DomainState { absent, running, paused, stopped };

// Domains by uuid, each with its state, as one listing found them.
using DomainStates = std::map<std::string, DomainState>;

// Why a domain is shut off, as libvirt tells it.
enum class StopCause {
  unknown,    // libvirt does not know (it restarted, the host rebooted), or it never ran
  shutdown,   // the guest powered itself off
  destroyed,  // someone pulled the plug (virsh destroy, or toyvm's own stop)
  crashed,    // QEMU died, or the guest crashed
};

// What a domain uses at one moment, as libvirt tells it.
struct DomainUsage {
  bool running = false;
  int64_t vcpus = 0;
  uint64_t cpu_time_ns = 0;   // all its vCPUs together, since its guest started
  uint64_t memory_kib = 0;    // what the guest has now
  int64_t rss_kib = -1;       // what its process holds in host RAM; -1: libvirt does not say
  int64_t disk_capacity = -1;    // the overlay's virtual size in bytes; -1: no disk
  int64_t disk_allocation = -1;  // what of it is allocated on the host, in bytes
  bool simulated = false;        // libvirt's test driver: the figures are made up
};

}  // namespace toyvm
