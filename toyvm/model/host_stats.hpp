#pragma once
// A compute host's figures as CIAO's launcher reports them in its STATS: memory and disk
// available, the one-minute load and the CPUs online. Parsers of the kernel's text are
// separate from the reading, for tests.

#include "core/error.hpp"
#include "model/records.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace toyvm {

struct MemoryFigures {
  int64_t total_mb = 0;
  int64_t available_mb = 0;  // MemFree + Active(file) + Inactive(file), as CIAO counts it
};
// /proc/meminfo's text; nothing when a field is missing.
std::optional<MemoryFigures> parse_meminfo(std::string_view text);
// /proc/loadavg's first figure.
std::optional<double> parse_loadavg(std::string_view text);
// The cpuN lines of /proc/stat (not the "cpu" total line).
int64_t count_online_cpus(std::string_view proc_stat);

// Whether figures measured `now` are worth a write over those `reported` last: memory or disk
// available moved by a twentieth of its total, the load by 1, the CPUs online at all. A
// cloud at rest then writes nothing (ten thousand hosts reporting every 30 s would be 333
// writes a second); its figures are never more than that far off.
bool worth_reporting(const HostStats& reported, const HostStats& now);

// Reads /proc/meminfo, /proc/loadavg, /proc/stat and statvfs(instance_dir).
result<HostStats> measure_host_stats(const std::string& instance_dir);

}  // namespace toyvm
