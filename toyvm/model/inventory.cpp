#include "model/inventory.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace toyvm {
namespace {

InventoryItem item(int64_t total, int64_t reserved, double ratio) {
  InventoryItem it;
  it.total = std::max<int64_t>(total, 0);
  // Placement refuses reserved > total; 1.26 allows reserved == total.
  it.reserved = std::clamp<int64_t>(reserved, 0, it.total);
  it.max_unit = std::max<int64_t>(it.total, 1);
  it.allocation_ratio = ratio;
  return it;
}

}  // namespace

Inventory inventory_from_host(const HostFacts& facts, const InventoryPolicy& policy) {
  Inventory inv;
  if (facts.cpus > 0) inv["VCPU"] = item(facts.cpus, policy.reserved_vcpu, policy.cpu_allocation_ratio);
  if (facts.memory_mb > 0)
    inv["MEMORY_MB"] = item(facts.memory_mb, policy.reserved_memory_mb, policy.ram_allocation_ratio);
  if (facts.disk_gb > 0)
    inv["DISK_GB"] = item(facts.disk_gb, policy.reserved_disk_gb, policy.disk_allocation_ratio);
  return inv;
}

Inventory inventory_from_amounts(const ResourceAmounts& amounts) {
  Inventory inv;
  for (auto& [rc, total] : amounts) inv[rc] = item(total, 0, 1.0);
  return inv;
}

ResourceAmounts capacity_of(const Inventory& inventory) {
  ResourceAmounts out;
  for (auto& [rc, it] : inventory) out[rc] = it.capacity();
  return out;
}

result<HostFacts> measure_host(const std::string& instance_dir) {
  HostFacts facts;
  facts.cpus = sysconf(_SC_NPROCESSORS_ONLN);
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemTotal:") {
      facts.memory_mb = kib / 1024;
      break;
    }
  }
  struct statvfs fs {};
  if (statvfs(instance_dir.c_str(), &fs) != 0) return errc::invalid_config;
  facts.disk_gb = int64_t((unsigned long long)fs.f_blocks * fs.f_frsize >> 30);
  if (facts.cpus <= 0 || facts.memory_mb <= 0) return errc::invalid_config;
  return facts;
}

}  // namespace toyvm
