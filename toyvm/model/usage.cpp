#include "model/usage.hpp"

#include <algorithm>

namespace toyvm {

InstanceUsage usage_between(const DomainUsage& first, const DomainUsage& second, double window_s) {
  InstanceUsage u;
  u.running = second.running;
  u.vcpus = second.vcpus;
  u.cpu_time_s = double(second.cpu_time_ns) / 1e9;
  u.window_s = window_s;
  // A guest that restarted between the samples has a counter that went back: no share known.
  if (second.running && window_s > 0 && second.vcpus > 0 && second.cpu_time_ns >= first.cpu_time_ns) {
    double busy_s = double(second.cpu_time_ns - first.cpu_time_ns) / 1e9;
    u.cpu_share = std::clamp(busy_s / (window_s * double(second.vcpus)), 0.0, 1.0);
  }
  u.memory_mb = int64_t(second.memory_kib / 1024);
  u.rss_mb = second.rss_kib < 0 ? -1 : second.rss_kib / 1024;
  u.disk_capacity = second.disk_capacity;
  u.disk_allocation = second.disk_allocation;
  u.simulated = second.simulated;
  return u;
}

}  // namespace toyvm
