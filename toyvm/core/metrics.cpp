#include "core/metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <mutex>
#include <variant>

namespace toyvm::metrics {
namespace {

enum class Type { counter, gauge, histogram };

struct Family {
  const char* name;
  Type type;
  const char* help;
  std::vector<double> buckets;  // histograms: upper bounds, ascending
};

using Registered = std::variant<prometheus::Family<prometheus::Counter>*, prometheus::Family<prometheus::Gauge>*,
                                prometheus::Family<prometheus::Histogram>*>;

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

// Each family registered once, in the order above; a series is made the first time its labels
// are used.
struct Registry {
  prometheus::Registry registry;
  std::map<std::string_view, std::pair<const Family*, Registered>> by_name;
  std::mutex mutex;  // the refreshers
  std::vector<std::function<void()>> refreshers;

  Registry() {
    for (const Family& family : families()) {
      Registered made;
      switch (family.type) {
        case Type::counter:
          made = &prometheus::BuildCounter().Name(family.name).Help(family.help).Register(registry);
          break;
        case Type::gauge: made = &prometheus::BuildGauge().Name(family.name).Help(family.help).Register(registry); break;
        case Type::histogram:
          made = &prometheus::BuildHistogram().Name(family.name).Help(family.help).Register(registry);
          break;
      }
      by_name.emplace(family.name, std::pair{&family, made});
    }
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

prometheus::Labels as_map(const Labels& labels) { return {labels.begin(), labels.end()}; }

template <typename Metric>
prometheus::Family<Metric>* family_of(std::string_view name) {
  auto found = registry().by_name.find(name);
  if (found == registry().by_name.end()) return nullptr;
  auto* family = std::get_if<prometheus::Family<Metric>*>(&found->second.second);
  return family ? *family : nullptr;
}

}  // namespace

void count(std::string_view name, const Labels& labels, double by) {
  if (auto* family = family_of<prometheus::Counter>(name)) family->Add(as_map(labels)).Increment(by);
}

double total(std::string_view name) {
  double sum = 0;
  if (auto* family = family_of<prometheus::Counter>(name))
    for (const prometheus::MetricFamily& collected : family->Collect())
      for (const prometheus::ClientMetric& series : collected.metric) sum += series.counter.value;
  return sum;
}

void set(std::string_view name, double value, const Labels& labels) {
  if (auto* family = family_of<prometheus::Gauge>(name)) family->Add(as_map(labels)).Set(value);
}

void observe(std::string_view name, double value, const Labels& labels) {
  auto* family = family_of<prometheus::Histogram>(name);
  if (!family) return;
  const Family& declared = *registry().by_name.find(name)->second.first;
  family->Add(as_map(labels), declared.buckets).Observe(value);
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
  return prometheus::TextSerializer().Serialize(r.registry.Collect());
}

}  // namespace toyvm::metrics
