#include "model/candidates.hpp"

#include <simdjson.h>

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

}  // namespace

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
    for (auto [rp, entry] : allocations) {
      simdjson::dom::object resources;
      if (entry["resources"].get_object().get(resources)) return errc::placement_error;
      if (!read_amounts(resources, candidate[std::string(rp)])) return errc::placement_error;
    }
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

std::vector<Choice> rank_candidates(const Candidates& candidates, const std::set<std::string>& live_hosts) {
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
  return choices;
}

}  // namespace toyvm
