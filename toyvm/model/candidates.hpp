#pragma once
// Allocation candidates from Placement and the scheduler's choice among them. Pure.

#include "core/error.hpp"
#include "model/query.hpp"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace toyvm {

// One way to satisfy a request: resource provider uuid -> what to claim from it.
using Allocations = std::map<std::string, ResourceAmounts>;

struct ProviderSummary {
  ResourceAmounts capacity;  // (total - reserved) * allocation_ratio
  ResourceAmounts used;
};

struct Candidates {
  std::vector<Allocations> allocation_requests;
  std::map<std::string, ProviderSummary> provider_summaries;
};

// Parses the body of GET /allocation_candidates.
result<Candidates> parse_allocation_candidates(const std::string& body);

struct Choice {
  std::string host;                 // the live toyvm host the instance goes to
  const Allocations* allocations;   // points into the Candidates it was chosen from
};

// The candidates worth claiming, best first: those whose allocation includes a live host.
// Placement's order is kept.
std::vector<Choice> rank_candidates(const Candidates& candidates, const std::set<std::string>& live_hosts);

}  // namespace toyvm
