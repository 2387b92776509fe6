#pragma once
// A hypervisor in memory: domains made, started, stopped, moved and destroyed on request, and
// nothing run. The simulated hosts of `toyvm compute --simulate` run on it (each host's agent
// is toyvm's own, only its hypervisor is not), and the unit tests' fake is built on it. Hosts
// of one process reach each other by their move URI (memory:///<host>), so a live move takes
// the domain from one to the other and a cold one its disk. Called from the agents' worker
// threads, hence the locks.

#include "virt/backend.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace toyvm {

class MemoryVirt;

// The simulated hosts of one process, by the URI a peer reaches each at.
class MemoryHosts {
 public:
  void add(const std::string& uri, MemoryVirt* host);
  void remove(const std::string& uri);
  MemoryVirt* find(const std::string& uri) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, MemoryVirt*> hosts_;
};

class MemoryVirt : public VirtBackend {
 public:
  struct Domain {
    DomainState state = DomainState::stopped;
    StopCause cause = StopCause::unknown;
    std::vector<GuestAddress> addresses;
    DomainSpec spec{};
  };

  MemoryVirt() = default;
  // Reachable by its peers in `hosts` at `uri` (memory:///<host>) until destroyed.
  MemoryVirt(std::shared_ptr<MemoryHosts> hosts, std::string uri);
  ~MemoryVirt() override;

  // --- what a test or the simulation arranges and reads ---
  // The machine's size, which host_stats reports less what its running domains take.
  void set_machine(int64_t memory_mb, int64_t disk_gb, int64_t cpus);
  void set(const std::string& uuid, Domain domain);
  std::optional<Domain> domain(const std::string& uuid) const;
  int creates() const;

  // --- VirtBackend ---
  result<void> create(const DomainSpec& spec) override;
  result<void> start(const std::string& uuid) override { return power(uuid, DomainState::running); }
  // No guest listens for ACPI here: the agent forces it off after asking.
  result<void> shutdown(const std::string&) override { return Error(errc::launch_failure, "no ACPI here"); }
  result<void> stop(const std::string& uuid) override { return power(uuid, DomainState::stopped); }
  result<void> destroy(const std::string& uuid) override;
  result<std::string> prepare_incoming(const DomainSpec& spec) override;
  result<MigrationStats> migrate(const std::string& uuid, const MigrationTarget& to) override;
  result<void> abort_migration(const std::string&) override { return {}; }
  result<void> send_disk(const std::string& uuid, const std::string& libvirt_uri, const std::string& disk) override;
  result<void> receive_disk(const DomainSpec& spec, const std::string& domain_xml) override;
  result<void> resize_in_place(const DomainSpec& spec) override;
  result<bool> migrating(const std::string&) override { return false; }
  result<void> ensure_network() override { return {}; }
  result<std::vector<std::string>> network_dns() override { return std::vector<std::string>{}; }
  result<std::vector<GuestAddress>> addresses(const std::string& uuid) override;
  result<DomainState> state(const std::string& uuid) override;
  result<DomainUsage> usage(const std::string& uuid) override;
  result<StopCause> stop_cause(const std::string& uuid) override;
  void on_lifecycle(std::function<void(const std::string&, bool)>) override {}
  result<DomainStates> list() override;
  // Its own figures, not the real machine's: a thousand simulated hosts of one process are a
  // thousand machines at rest, not one under load.
  result<HostStats> host_stats() override;

 private:
  result<void> power(const std::string& uuid, DomainState state);
  // A guest arriving running from a peer.
  result<void> arrive(const std::string& uuid);
  void disk_arrived(const std::string& uuid);

  std::shared_ptr<MemoryHosts> hosts_;
  std::string uri_;
  mutable std::mutex mutex_;
  std::map<std::string, Domain> domains_;
  std::set<std::string> received_disks_;  // a cold move's disks, here before their domains
  int creates_ = 0;
  int64_t memory_mb_ = 8192, disk_gb_ = 100, cpus_ = 4;
};

}  // namespace toyvm
