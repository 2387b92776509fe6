#include "model/candidates.hpp"

#include <simdjson.h>

#include <algorithm>

namespace toyvm {
namespace {

bool read_amounts(simdjson::dom::object object, ResourceAmounts& out) {
  for (auto [key, value] : object) {
    int64_t n = 0;
    if (value.get_int64().get(n)) return false;
    out[std::string(key)] = n;
  }
  return true;
}

// {rp: {"resources": {...}}, ...}: the shape of every allocation in Placement's answers.
bool read_allocations(simdjson::dom::object object, Allocations& out) {
  for (auto [rp, entry] : object) {
    simdjson::dom::object resources;
    if (entry["resources"].get_object().get(resources) || !read_amounts(resources, out[std::string(rp)]))
      return false;
  }
  return true;
}

}  // namespace

result<Allocations> parse_allocations(const std::string& body) {
  simdjson::dom::parser parser;
  simdjson::dom::object allocations;
  Allocations out;
  if (parser.parse(body)["allocations"].get_object().get(allocations) || !read_allocations(allocations, out))
    return errc::placement_error;
  return out;
}

result<ConsumerAllocations> parse_consumer_allocations(const std::string& body) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::dom::object allocations;
  ConsumerAllocations out;
  if (parser.parse(body).get(doc) || doc["allocations"].get_object().get(allocations) ||
      !read_allocations(allocations, out.allocations))
    return errc::placement_error;
  int64_t generation = 0;
  if (!doc["consumer_generation"].get_int64().get(generation)) out.generation = generation;
  std::string_view id;
  if (!doc["project_id"].get_string().get(id)) out.owner.project = id;
  if (!doc["user_id"].get_string().get(id)) out.owner.user = id;
  return out;
}

result<std::vector<std::string>> parse_provider_uuids(const std::string& body) {
  simdjson::dom::parser parser;
  simdjson::dom::array providers;
  if (parser.parse(body)["resource_providers"].get_array().get(providers)) return errc::placement_error;
  std::vector<std::string> uuids;
  for (simdjson::dom::element provider : providers) {
    std::string_view uuid;
    if (provider["uuid"].get_string().get(uuid)) return errc::placement_error;
    uuids.emplace_back(uuid);
  }
  return uuids;
}

Candidates one_provider_candidates(const std::string& provider, const ResourceAmounts& capacity,
                                   const ResourceAmounts& used, const ResourceAmounts& asked) {
  Candidates out;
  out.provider_summaries[provider] = ProviderSummary{capacity, used};
  const bool fits = std::all_of(asked.begin(), asked.end(), [&](const auto& rc_amount) {
    auto total = capacity.find(rc_amount.first);
    auto taken = used.find(rc_amount.first);
    return total != capacity.end() && (taken == used.end() ? 0 : taken->second) + rc_amount.second <= total->second;
  });
  if (fits) out.allocation_requests.push_back({{provider, asked}});
  return out;
}

result<ResourceAmounts> parse_usages(const std::string& body) {
  simdjson::dom::parser parser;
  simdjson::dom::object usages;
  ResourceAmounts out;
  if (parser.parse(body)["usages"].get_object().get(usages) || !read_amounts(usages, out)) return errc::placement_error;
  return out;
}

result<Candidates> parse_allocation_candidates(const std::string& body) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(body).get(doc)) return errc::placement_error;
  Candidates out;
  simdjson::dom::array requests;
  if (doc["allocation_requests"].get_array().get(requests)) return errc::placement_error;
  for (simdjson::dom::element request : requests) {
    simdjson::dom::object allocations;
    if (request["allocations"].get_object().get(allocations)) return errc::placement_error;
    Allocations candidate;
    if (!read_allocations(allocations, candidate)) return errc::placement_error;
    out.allocation_requests.push_back(std::move(candidate));
  }
  simdjson::dom::object summaries;
  if (!doc["provider_summaries"].get_object().get(summaries)) {
    for (auto [rp, summary] : summaries) {
      simdjson::dom::object resources;
      if (summary["resources"].get_object().get(resources)) continue;
      ProviderSummary& s = out.provider_summaries[std::string(rp)];
      for (auto [rc, amounts] : resources) {
        int64_t capacity = 0, used = 0;
        if (amounts["capacity"].get_int64().get(capacity) || amounts["used"].get_int64().get(used))
          continue;
        s.capacity[std::string(rc)] = capacity;
        s.used[std::string(rc)] = used;
      }
    }
  }
  return out;
}

std::vector<Choice> rank_candidates(const Candidates& candidates, const std::set<std::string>& live_hosts,
                                    const WeighPolicy& policy, double random) {
  std::vector<Choice> choices;
  choices.reserve(candidates.allocation_requests.size());
  for (const Allocations& allocations : candidates.allocation_requests) {
    for (auto& [rp, resources] : allocations) {
      if (live_hosts.count(rp)) {
        choices.push_back(Choice{rp, &allocations});
        break;
      }
    }
  }
  if (choices.size() < 2) return choices;

  // Free share of each class per host, then each weigher scaled to 0..1 across the hosts.
  static constexpr const char* classes[] = {"MEMORY_MB", "VCPU", "DISK_GB"};
  const double multipliers[] = {policy.ram_multiplier, policy.cpu_multiplier, policy.disk_multiplier};
  std::vector<double> weight(choices.size(), 0.0);
  for (size_t c = 0; c < 3; ++c) {
    std::vector<double> free(choices.size(), 0.0);
    for (size_t i = 0; i < choices.size(); ++i) {
      auto summary = candidates.provider_summaries.find(choices[i].host);
      if (summary == candidates.provider_summaries.end()) continue;
      auto capacity = summary->second.capacity.find(classes[c]);
      auto used = summary->second.used.find(classes[c]);
      if (capacity == summary->second.capacity.end() || capacity->second <= 0) continue;
      free[i] = double(capacity->second - (used == summary->second.used.end() ? 0 : used->second)) /
                double(capacity->second);
    }
    auto [lo, hi] = std::minmax_element(free.begin(), free.end());
    double range = *hi - *lo;
    for (size_t i = 0; i < choices.size(); ++i) {
      double scaled = range > 0 ? (free[i] - *lo) / range : 0.0;
      weight[i] += multipliers[c] * (policy.kind == WeighPolicy::Kind::spread ? scaled : -scaled);
    }
  }
  std::vector<size_t> order(choices.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Stable: equal weights keep Placement's order.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return weight[a] > weight[b]; });
  size_t subset = std::clamp<size_t>(size_t(std::max(policy.host_subset_size, 1)), 1, order.size());
  size_t pick = std::min(size_t(random * double(subset)), subset - 1);
  std::rotate(order.begin(), order.begin() + long(pick), order.begin() + long(pick) + 1);

  std::vector<Choice> ranked;
  ranked.reserve(choices.size());
  for (size_t i : order) ranked.push_back(choices[i]);
  return ranked;
}

std::optional<WeighPolicy::Kind> parse_weigh_kind(std::string_view name) {
  if (name == "spread") return WeighPolicy::Kind::spread;
  if (name == "pack") return WeighPolicy::Kind::pack;
  return std::nullopt;
}

}  // namespace toyvm
