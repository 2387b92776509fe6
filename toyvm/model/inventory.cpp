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

std::vector<std::string> cpu_traits(std::string_view cpuinfo) {
  // /proc/cpuinfo flag -> os-traits name (hw/cpu/x86).
  static constexpr std::pair<std::string_view, std::string_view> known[] = {
      {"mmx", "MMX"},       {"sse", "SSE"},         {"sse2", "SSE2"},       {"pni", "SSE3"},
      {"ssse3", "SSSE3"},   {"sse4_1", "SSE41"},    {"sse4_2", "SSE42"},    {"sse4a", "SSE4A"},
      {"avx", "AVX"},       {"avx2", "AVX2"},       {"fma", "FMA3"},        {"fma4", "FMA4"},
      {"aes", "AES"},       {"pclmulqdq", "CLMUL"}, {"bmi1", "BMI"},        {"bmi2", "BMI2"},
      {"f16c", "F16C"},     {"abm", "ABM"},         {"sha_ni", "SHA"},      {"xop", "XOP"},
      {"tbm", "TBM"},       {"vmx", "VMX"},         {"svm", "SVM"},         {"avx512f", "AVX512F"},
      {"avx512cd", "AVX512CD"}, {"avx512bw", "AVX512BW"}, {"avx512dq", "AVX512DQ"},
      {"avx512vl", "AVX512VL"},
  };
  std::vector<std::string> traits;
  size_t at = cpuinfo.find("\nflags");
  if (at == std::string_view::npos) return traits;
  std::string_view line = cpuinfo.substr(at + 1);
  line = line.substr(0, line.find('\n'));
  line = line.substr(line.find(':') == std::string_view::npos ? line.size() : line.find(':') + 1);
  auto has = [&](std::string_view flag) {
    size_t pos = 0;
    while ((pos = line.find(flag, pos)) != std::string_view::npos) {
      bool starts = pos == 0 || line[pos - 1] == ' ';
      bool ends = pos + flag.size() == line.size() || line[pos + flag.size()] == ' ';
      if (starts && ends) return true;
      pos += flag.size();
    }
    return false;
  };
  for (auto& [flag, trait] : known) {
    if (has(flag)) traits.push_back("HW_CPU_X86_" + std::string(trait));
  }
  return traits;
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
