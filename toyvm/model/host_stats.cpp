#include "model/host_stats.hpp"

#include <fmt/format.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace toyvm {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

template <typename Each>
void each_line(std::string_view text, Each each) {
  while (!text.empty()) {
    size_t end = text.find('\n');
    each(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
}

std::string read_text(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::optional<MemoryFigures> parse_meminfo(std::string_view text) {
  std::optional<int64_t> total, free, active_file, inactive_file;
  each_line(text, [&](std::string_view line) {
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return;
    std::string_view key = line.substr(0, colon);
    std::string_view value = trim(line.substr(colon + 1));  // "12345 kB"
    int64_t kib = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), kib);
    if (ec != std::errc()) return;
    if (key == "MemTotal") total = kib;
    if (key == "MemFree") free = kib;
    if (key == "Active(file)") active_file = kib;
    if (key == "Inactive(file)") inactive_file = kib;
  });
  if (!total || !free || !active_file || !inactive_file) return std::nullopt;
  return MemoryFigures{*total / 1024, (*free + *active_file + *inactive_file) / 1024};
}

std::optional<double> parse_loadavg(std::string_view text) {
  text = trim(text);
  double load = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), load);
  if (ec != std::errc() || load < 0) return std::nullopt;
  return load;
}

int64_t count_online_cpus(std::string_view proc_stat) {
  int64_t cpus = 0;
  each_line(proc_stat, [&](std::string_view line) {
    if (line.size() > 3 && line.starts_with("cpu") && line[3] >= '0' && line[3] <= '9') ++cpus;
  });
  return cpus;
}

result<HostStats> measure_host_stats(const std::string& instance_dir) {
  HostStats stats;
  auto memory = parse_meminfo(read_text("/proc/meminfo"));
  auto load = parse_loadavg(read_text("/proc/loadavg"));
  stats.cpus_online = count_online_cpus(read_text("/proc/stat"));
  struct statvfs fs {};
  if (!memory || !load || stats.cpus_online == 0 || statvfs(instance_dir.c_str(), &fs) != 0)
    return Error(errc::invalid_config,
                 fmt::format("cannot read /proc/meminfo, /proc/loadavg, /proc/stat or {}", instance_dir));
  stats.mem_total_mb = memory->total_mb;
  stats.mem_available_mb = memory->available_mb;
  stats.load = *load;
  stats.disk_total_mb = int64_t((unsigned long long)fs.f_blocks * fs.f_frsize >> 20);
  stats.disk_available_mb = int64_t((unsigned long long)fs.f_bavail * fs.f_frsize >> 20);
  stats.at = unix_seconds();
  return stats;
}

bool worth_reporting(const HostStats& reported, const HostStats& now) {
  auto moved = [](int64_t before, int64_t after, int64_t total) { return std::abs(after - before) * 20 >= std::max<int64_t>(total, 1); };
  return moved(reported.mem_available_mb, now.mem_available_mb, now.mem_total_mb) ||
         moved(reported.disk_available_mb, now.disk_available_mb, now.disk_total_mb) ||
         reported.mem_total_mb != now.mem_total_mb || reported.disk_total_mb != now.disk_total_mb ||
         std::abs(reported.load - now.load) >= 1.0 || reported.cpus_online != now.cpus_online;
}

}  // namespace toyvm
