#pragma once
// The inventory a compute host reports to Placement: measured from the host, or given.

#include "core/config.hpp"
#include "model/query.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace toyvm {

struct InventoryItem {
  int64_t total = 0;
  int64_t reserved = 0;
  int64_t min_unit = 1;
  int64_t max_unit = 0;
  int64_t step_size = 1;
  double allocation_ratio = 1.0;

  // What Placement lets consumers claim in all.
  int64_t capacity() const { return int64_t(double(total - reserved) * allocation_ratio); }
  bool operator==(const InventoryItem&) const = default;
};

using Inventory = std::map<std::string, InventoryItem>;  // resource class -> item

// What the host has, measured by the agent.
struct HostFacts {
  int64_t cpus = 0;
  int64_t memory_mb = 0;
  int64_t disk_gb = 0;  // the filesystem that holds the instance dir
};

Inventory inventory_from_host(const HostFacts& facts, const InventoryPolicy& policy);
// `--inventory VCPU:4,DISK_GB:10,MEMORY_MB:512`: totals as given, nothing reserved, ratio 1.
Inventory inventory_from_amounts(const ResourceAmounts& amounts);
ResourceAmounts capacity_of(const Inventory& inventory);

// Placement's standard HW_CPU_X86_* traits for the flags in /proc/cpuinfo's text.
std::vector<std::string> cpu_traits(std::string_view cpuinfo);

// Reads /proc/meminfo, the CPU count and statvfs(instance_dir).
result<HostFacts> measure_host(const std::string& instance_dir);

}  // namespace toyvm
