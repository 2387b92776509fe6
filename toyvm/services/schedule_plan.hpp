#pragma once
// The parts of `toyvm schedule` that decide without asking anyone: where each instance of a
// batch goes, and what handing an instance over costs a transaction. Unit tested.

#include "model/keys.hpp"
#include "model/records.hpp"
#include "model/txn_limits.hpp"
#include "services/placer.hpp"

#include <cstddef>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace toyvm {

// Where each instance of a batch goes, planned against a local copy of the free capacity,
// so that they spread (or pack) before they reach Placement instead of all colliding on
// the best host. Nothing when one of them fits nowhere.
std::optional<std::vector<Claim>> plan_batch(PlacementView view, size_t count, const WeighPolicy& policy,
                                             std::optional<GroupPolicy> group, std::mt19937_64& rng);

// Requests that arrived together (each `counts[i]` instances of one query, no group), planned
// in turn against one look: each all or nothing, none planned into room an earlier one took.
// Nothing for a request that fits nowhere in what is left.
std::vector<std::optional<std::vector<Claim>>> plan_requests(PlacementView view, const std::vector<size_t>& counts,
                                                             const WeighPolicy& policy, std::mt19937_64& rng);

// Requests that waited together (`projects[i]` is request i's project) shared among at most
// `parts` batches to run at once, each project's whole in one (its quota is checked over its
// requests together), the biggest projects first into the smallest batch. Each batch lists
// its requests' indexes in their order; none is empty.
std::vector<std::vector<size_t>> split_by_project(const std::vector<std::string>& projects, size_t parts);

// A batch's requests (`providers[i]`: the providers request i's claims touch; `sizes[i]`: its
// instances) shared among at most `parts` claims sent at once, none touching a provider
// another touches: Placement bumps the generation of every provider a claim touches, so such
// claims never make each other retry. Each request is whole in one part, as are requests
// linked through a provider; the biggest such group first into the part with fewest instances.
// Each part lists its requests' indexes in their order; none is empty.
std::vector<std::vector<size_t>> split_claims(const std::vector<std::vector<std::string>>& providers,
                                              const std::vector<size_t>& sizes, size_t parts);

// What handing one instance over adds to a transaction: its work, record and group
// membership, each compared absent and written; its hold, compared present and erased.
TxnCost hand_over_cost(const KeyLayout& keys, const WorkSpec& spec, const InstanceRecord& record);

}  // namespace toyvm
