#pragma once
// Allocation candidates from Placement and the scheduler's choice among them. Pure.

#include "core/error.hpp"
#include "model/query.hpp"

#include <map>
#include <optional>
#include <string_view>
#include <set>
#include <string>
#include <vector>

namespace toyvm {

// Placement's standard trait of a host out of service: every schedule forbids it. An agent
// that stops cleanly, and an operator's `host disable`, put it on the host's provider.
inline constexpr std::string_view disabled_trait = "COMPUTE_STATUS_DISABLED";

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

// The body of GET /allocations/{consumer}.
result<Allocations> parse_allocations(const std::string& body);
// Whose a consumer is, as Placement names it: every allocation write carries both, and one
// that names others changes the consumer's.
struct ConsumerOwner {
  std::string project;  // project_id
  std::string user;     // user_id

  bool operator==(const ConsumerOwner&) const = default;
};
struct ConsumerAllocations {
  Allocations allocations;
  std::optional<int64_t> generation;  // none for a consumer Placement does not know
  ConsumerOwner owner;                // empty when it holds nothing
};
result<ConsumerAllocations> parse_consumer_allocations(const std::string& body);
// The uuids in the body of GET /resource_providers.
result<std::vector<std::string>> parse_provider_uuids(const std::string& body);
// The body of GET /resource_providers/{uuid}/usages.
result<ResourceAmounts> parse_usages(const std::string& body);

// What Placement's search would answer about one provider alone, for `asked` and no traits,
// from its capacity and its usage: its summary, and the allocation request of `asked` on it
// when every class fits (one it has no capacity of does not).
Candidates one_provider_candidates(const std::string& provider, const ResourceAmounts& capacity,
                                   const ResourceAmounts& used, const ResourceAmounts& asked);

struct Choice {
  std::string host;                 // the live toyvm host the instance goes to
  const Allocations* allocations;   // points into the Candidates it was chosen from
};

// How to weigh hosts (Nova's weighers): each host's free share of RAM, VCPU and disk, scaled
// to 0..1 across the candidates and multiplied; `spread` prefers the emptiest host, `pack`
// the fullest. The best `host_subset_size` hosts are shuffled, so that concurrent schedulers
// do not all race for the same one.
struct WeighPolicy {
  enum class Kind { spread, pack };
  Kind kind = Kind::spread;
  double ram_multiplier = 1.0;
  double cpu_multiplier = 1.0;
  double disk_multiplier = 1.0;
  int host_subset_size = 1;
};

// The candidates worth claiming, best first: those whose allocation includes a live host.
// `random` picks within the best subset (any value in [0, 1)).
std::vector<Choice> rank_candidates(const Candidates& candidates, const std::set<std::string>& live_hosts,
                                    const WeighPolicy& policy = {}, double random = 0.0);

std::optional<WeighPolicy::Kind> parse_weigh_kind(std::string_view name);

}  // namespace toyvm
