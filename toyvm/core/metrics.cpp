#include "core/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>

namespace toyvm::metrics {
namespace {

enum class Type { counter, gauge, histogram };

struct Family {
  const char* name;
  Type type;
  const char* help;
  std::vector<double> buckets;  // histograms: upper bounds, ascending
};

const std::vector<double> request_buckets{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
const std::vector<double> build_buckets{0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300};

const std::vector<Family>& families() {
  static const std::vector<Family> all{
      {"toyvm_instances", Type::gauge, "Instances on this host by the state it recorded", {}},
      {"toyvm_builds_total", Type::counter, "Builds ended, by result (active, failed)", {}},
      {"toyvm_build_seconds", Type::histogram, "From a build's start to its domain running", build_buckets},
      {"toyvm_moves_total", Type::counter, "Moves of running guests this host ended (as either side), by result (moved, reverted)",
       {}},
      {"toyvm_move_seconds", Type::histogram, "A running guest's move to another host, its disk copied along",
       build_buckets},
      {"toyvm_instance_failures_total", Type::counter, "Instances recorded ERROR, by reason code", {}},
      {"toyvm_guest_events_total", Type::counter,
       "Guests that stopped without toyvm, by what became of them (stopped, restarted, error)", {}},
      {"toyvm_placement_requests_total", Type::counter,
       "Placement requests by method and HTTP status (\"unavailable\": no answer)", {}},
      {"toyvm_placement_request_seconds", Type::histogram, "Placement request latency, retries included",
       request_buckets},
      {"toyvm_etcd_requests_total", Type::counter, "etcd calls by gRPC status", {}},
      {"toyvm_etcd_request_seconds", Type::histogram, "etcd call latency", request_buckets},
      {"toyvm_etcd_watch_restarts_total", Type::counter, "Watches that ended and were listed and opened again", {}},
      {"toyvm_work_listings_total", Type::counter,
       "Full listings of this host's work compared with its domains (start, resync, a lost watch)", {}},
      {"toyvm_mdserver_requests_total", Type::counter, "Metadata requests by HTTP status", {}},
      {"toyvm_mdserver_request_seconds", Type::histogram, "Metadata request latency, read to written",
       request_buckets},
      {"toyvm_mdserver_rate_limited_total", Type::counter, "Metadata requests refused by the per-source rate limit",
       {}},
  };
  return all;
}

struct Series {
  double value = 0;                  // counters and gauges
  std::vector<uint64_t> bucket_hits; // histograms: per bucket, not cumulative
  double sum = 0;
  uint64_t count = 0;
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::map<Labels, Series>, std::less<>> series;
  std::vector<std::function<void()>> refreshers;
};

Registry& registry() {
  static Registry r;
  return r;
}

const Family* find(std::string_view name) {
  for (const Family& family : families())
    if (family.name == name) return &family;
  return nullptr;
}

Labels sorted(Labels labels) {
  std::sort(labels.begin(), labels.end());
  return labels;
}

// A label value or help text as the text format wants it escaped.
std::string escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string label_text(const Labels& labels, const std::string& extra = {}) {
  std::string text;
  for (const auto& [key, value] : labels) text += fmt::format("{}{}=\"{}\"", text.empty() ? "" : ",", key, escape(value));
  if (!extra.empty()) text += (text.empty() ? "" : ",") + extra;
  return text.empty() ? "" : "{" + text + "}";
}

std::string number(double value) {
  if (value == double(int64_t(value))) return fmt::format("{}", int64_t(value));
  return fmt::format("{}", value);
}

}  // namespace

void count(std::string_view name, const Labels& labels, double by) {
  if (!find(name)) return;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.series[std::string(name)][sorted(labels)].value += by;
}

void set(std::string_view name, double value, const Labels& labels) {
  if (!find(name)) return;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.series[std::string(name)][sorted(labels)].value = value;
}

void observe(std::string_view name, double value, const Labels& labels) {
  const Family* family = find(name);
  if (!family || family->type != Type::histogram) return;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  Series& s = r.series[std::string(name)][sorted(labels)];
  s.bucket_hits.resize(family->buckets.size());
  auto bound = std::lower_bound(family->buckets.begin(), family->buckets.end(), value);
  if (bound != family->buckets.end()) ++s.bucket_hits[size_t(bound - family->buckets.begin())];
  s.sum += value;
  s.count += 1;
}

void on_render(std::function<void()> refresh) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.refreshers.push_back(std::move(refresh));
}

std::string render() {
  Registry& r = registry();
  std::vector<std::function<void()>> refreshers;
  {
    std::lock_guard lock(r.mutex);
    refreshers = r.refreshers;
  }
  for (auto& refresh : refreshers) refresh();
  std::lock_guard lock(r.mutex);
  std::string out;
  for (const Family& family : families()) {
    auto found = r.series.find(std::string_view(family.name));
    if (found == r.series.end()) continue;
    const char* type = family.type == Type::counter ? "counter" : family.type == Type::gauge ? "gauge" : "histogram";
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", family.name, escape(family.help), family.name, type);
    for (const auto& [labels, s] : found->second) {
      if (family.type != Type::histogram) {
        out += fmt::format("{}{} {}\n", family.name, label_text(labels), number(s.value));
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i < family.buckets.size(); ++i) {
        cumulative += i < s.bucket_hits.size() ? s.bucket_hits[i] : 0;
        out += fmt::format("{}_bucket{} {}\n", family.name,
                           label_text(labels, fmt::format("le=\"{}\"", number(family.buckets[i]))), cumulative);
      }
      out += fmt::format("{}_bucket{} {}\n", family.name, label_text(labels, "le=\"+Inf\""), s.count);
      out += fmt::format("{}_sum{} {}\n", family.name, label_text(labels), number(s.sum));
      out += fmt::format("{}_count{} {}\n", family.name, label_text(labels), s.count);
    }
  }
  return out;
}

}  // namespace toyvm::metrics
