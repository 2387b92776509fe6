#include "virt/memory_backend.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace toyvm {

void MemoryHosts::add(const std::string& uri, MemoryVirt* host) {
  std::lock_guard lock(mutex_);
  hosts_[uri] = host;
}

void MemoryHosts::remove(const std::string& uri) {
  std::lock_guard lock(mutex_);
  hosts_.erase(uri);
}

MemoryVirt* MemoryHosts::find(const std::string& uri) const {
  std::lock_guard lock(mutex_);
  auto found = hosts_.find(uri);
  return found == hosts_.end() ? nullptr : found->second;
}

MemoryVirt::MemoryVirt(std::shared_ptr<MemoryHosts> hosts, std::string uri)
    : hosts_(std::move(hosts)), uri_(std::move(uri)) {
  if (hosts_) hosts_->add(uri_, this);
}

MemoryVirt::~MemoryVirt() {
  if (hosts_) hosts_->remove(uri_);
}

void MemoryVirt::set(const std::string& uuid, Domain domain) {
  std::lock_guard lock(mutex_);
  domains_[uuid] = std::move(domain);
}

std::optional<MemoryVirt::Domain> MemoryVirt::domain(const std::string& uuid) const {
  std::lock_guard lock(mutex_);
  auto found = domains_.find(uuid);
  return found == domains_.end() ? std::nullopt : std::optional<Domain>(found->second);
}

int MemoryVirt::creates() const {
  std::lock_guard lock(mutex_);
  return creates_;
}

result<void> MemoryVirt::create(const DomainSpec& spec) {
  std::lock_guard lock(mutex_);
  ++creates_;
  Domain& d = domains_[spec.uuid];
  d.state = spec.start ? DomainState::running : DomainState::stopped;
  d.cause = StopCause::unknown;
  d.spec = spec;
  return {};
}

result<void> MemoryVirt::destroy(const std::string& uuid) {
  std::lock_guard lock(mutex_);
  domains_.erase(uuid);
  return {};
}

result<std::string> MemoryVirt::prepare_incoming(const DomainSpec& spec) {
  return "<domain>" + spec.uuid + "</domain>";
}

result<MigrationStats> MemoryVirt::migrate(const std::string& uuid, const MigrationTarget& to) {
  {
    std::lock_guard lock(mutex_);
    auto found = domains_.find(uuid);
    if (found == domains_.end()) return Error(errc::not_found, "no such domain");
    if (found->second.state != DomainState::running) return Error(errc::launch_failure, "the domain is not running");
  }
  // A peer of this process takes it running; without one (a unit test's lone host) it just leaves.
  if (MemoryVirt* peer = hosts_ ? hosts_->find(to.libvirt_uri) : nullptr) {
    if (auto arrived = peer->arrive(uuid); !arrived) return arrived.error();
  } else if (hosts_) {
    return Error(errc::launch_failure, "no simulated host at " + to.libvirt_uri);
  }
  std::lock_guard lock(mutex_);
  domains_.erase(uuid);
  return MigrationStats{};
}

result<void> MemoryVirt::send_disk(const std::string& uuid, const std::string& libvirt_uri, const std::string&) {
  MemoryVirt* peer = hosts_ ? hosts_->find(libvirt_uri) : nullptr;
  if (!peer) return Error(errc::launch_failure, "no simulated host at " + libvirt_uri);
  if (!domain(uuid)) return Error(errc::not_found, "no such domain");
  peer->disk_arrived(uuid);
  return {};
}

void MemoryVirt::disk_arrived(const std::string& uuid) {
  std::lock_guard lock(mutex_);
  // Not a domain yet: only the disk, which receive_disk defines a domain around.
  received_disks_.insert(uuid);
}

result<void> MemoryVirt::receive_disk(const DomainSpec& spec, const std::string&) {
  std::lock_guard lock(mutex_);
  if (!received_disks_.erase(spec.uuid)) return Error(errc::launch_failure, "its disk never came");
  Domain& d = domains_[spec.uuid];
  d.state = DomainState::stopped;
  d.spec = spec;
  return {};
}

result<void> MemoryVirt::resize_in_place(const DomainSpec& spec) {
  std::lock_guard lock(mutex_);
  auto found = domains_.find(spec.uuid);
  if (found == domains_.end()) return Error(errc::not_found, "no such domain");
  found->second.spec = spec;
  return {};
}

result<void> MemoryVirt::arrive(const std::string& uuid) {
  std::lock_guard lock(mutex_);
  if (domains_.count(uuid)) return Error(errc::already_exists, "the domain is here already");
  domains_[uuid].state = DomainState::running;
  return {};
}

result<std::vector<GuestAddress>> MemoryVirt::addresses(const std::string& uuid) {
  std::lock_guard lock(mutex_);
  auto found = domains_.find(uuid);
  if (found == domains_.end()) return std::vector<GuestAddress>{};
  if (!found->second.addresses.empty() || !hosts_ || found->second.state != DomainState::running)
    return found->second.addresses;
  // A simulated guest has its address at once, as DHCP would give it: one of 10/8, the same
  // on every host it moves to.
  const unsigned long bits = std::stoul(uuid.substr(0, 6), nullptr, 16);
  return std::vector<GuestAddress>{
      GuestAddress{instance_mac(uuid), fmt::format("10.{}.{}.{}", (bits >> 16) & 0xff, (bits >> 8) & 0xff, 1 + (bits & 0xff) % 254)}};
}

result<DomainState> MemoryVirt::state(const std::string& uuid) {
  std::lock_guard lock(mutex_);
  auto found = domains_.find(uuid);
  return found == domains_.end() ? DomainState::absent : found->second.state;
}

result<DomainUsage> MemoryVirt::usage(const std::string& uuid) {
  std::lock_guard lock(mutex_);
  DomainUsage usage;
  usage.simulated = true;
  auto found = domains_.find(uuid);
  if (found == domains_.end()) return usage;
  usage.running = found->second.state == DomainState::running;
  usage.vcpus = found->second.spec.vcpus;
  usage.memory_kib = uint64_t(found->second.spec.memory_mb) * 1024;
  return usage;
}

void MemoryVirt::set_machine(int64_t memory_mb, int64_t disk_gb, int64_t cpus) {
  std::lock_guard lock(mutex_);
  memory_mb_ = memory_mb;
  disk_gb_ = disk_gb;
  cpus_ = cpus;
}

result<HostStats> MemoryVirt::host_stats() {
  std::lock_guard lock(mutex_);
  HostStats stats;
  stats.mem_total_mb = stats.mem_available_mb = memory_mb_;
  stats.disk_total_mb = stats.disk_available_mb = disk_gb_ * 1024;
  stats.cpus_online = cpus_;
  for (const auto& [uuid, domain] : domains_) {
    stats.disk_available_mb -= domain.spec.disk_gb * 1024;
    if (domain.state == DomainState::running) stats.mem_available_mb -= domain.spec.memory_mb;
  }
  stats.at = unix_seconds();
  return stats;
}

result<StopCause> MemoryVirt::stop_cause(const std::string& uuid) {
  std::lock_guard lock(mutex_);
  auto found = domains_.find(uuid);
  return found == domains_.end() ? StopCause::unknown : found->second.cause;
}

result<DomainStates> MemoryVirt::list() {
  std::lock_guard lock(mutex_);
  DomainStates listed;
  for (const auto& [uuid, d] : domains_) listed.emplace_hint(listed.end(), uuid, d.state);
  return listed;
}

result<void> MemoryVirt::power(const std::string& uuid, DomainState state) {
  std::lock_guard lock(mutex_);
  auto found = domains_.find(uuid);
  if (found == domains_.end()) return Error(errc::not_found, "no such domain");
  found->second.state = state;
  found->second.cause = StopCause::unknown;
  return {};
}

}  // namespace toyvm
