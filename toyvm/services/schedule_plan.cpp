// Batch planning and hand-over costs for `toyvm schedule`: pure functions of what Placement
// and etcd showed, kept apart from the claims and writes so that they can be tested alone.

#include "services/schedule_plan.hpp"

#include <algorithm>
#include <map>
#include <numeric>

namespace toyvm {

namespace {

// plan_batch's work on `view` itself: what it plans is taken from the view's free capacity
// (all of it, or, when an instance fits nowhere, some of it: the caller keeps a copy).
std::optional<std::vector<Claim>> plan_into(PlacementView& view, size_t count, const WeighPolicy& policy,
                                            std::optional<GroupPolicy> group, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<Claim> plan;
  for (size_t i = 0; i < count; ++i) {
    std::vector<Choice> ranked = Placer::rank(view, policy, uniform(rng), group);
    auto fits = [&](const Choice& choice) {
      for (auto& [rp, resources] : *choice.allocations) {
        auto summary = view.candidates.provider_summaries.find(rp);
        if (summary == view.candidates.provider_summaries.end()) continue;
        for (auto& [rc, amount] : resources) {
          auto capacity = summary->second.capacity.find(rc);
          if (capacity != summary->second.capacity.end() && summary->second.used[rc] + amount > capacity->second)
            return false;
        }
      }
      return true;
    };
    auto first = std::find_if(ranked.begin(), ranked.end(), fits);
    if (first == ranked.end()) return std::nullopt;
    for (auto& [rp, resources] : *first->allocations)
      for (auto& [rc, amount] : resources) view.candidates.provider_summaries[rp].used[rc] += amount;
    view.group_members[first->host] += 1;  // later instances of the batch see it
    plan.push_back(Claim{first->host, *first->allocations});
  }
  return plan;
}

// Groups of indexes (each with its `weights`, summed) packed into at most `parts` parts, each
// group whole in one: the heaviest first into the lightest part. Indexes in order in each part.
std::vector<std::vector<size_t>> pack_groups(std::vector<std::vector<size_t>> groups,
                                             const std::vector<size_t>& weights, size_t parts) {
  auto weight = [&](const std::vector<size_t>& indexes) {
    size_t sum = 0;
    for (size_t i : indexes) sum += weights[i];
    return sum;
  };
  std::stable_sort(groups.begin(), groups.end(), [&](const auto& a, const auto& b) { return weight(a) > weight(b); });
  std::vector<std::vector<size_t>> packed(std::min(std::max<size_t>(parts, 1), groups.size()));
  for (std::vector<size_t>& group : groups) {
    auto lightest = std::min_element(packed.begin(), packed.end(),
                                     [&](const auto& a, const auto& b) { return weight(a) < weight(b); });
    lightest->insert(lightest->end(), group.begin(), group.end());
  }
  for (std::vector<size_t>& part : packed) std::sort(part.begin(), part.end());
  return packed;
}

}  // namespace

std::optional<std::vector<Claim>> plan_batch(PlacementView view, size_t count, const WeighPolicy& policy,
                                             std::optional<GroupPolicy> group, std::mt19937_64& rng) {
  return plan_into(view, count, policy, group, rng);
}

std::vector<std::optional<std::vector<Claim>>> plan_requests(PlacementView view, const std::vector<size_t>& counts,
                                                             const WeighPolicy& policy, std::mt19937_64& rng) {
  std::vector<std::optional<std::vector<Claim>>> plans;
  for (const size_t count : counts) {
    PlacementView trial = view;
    auto plan = plan_into(trial, count, policy, std::nullopt, rng);
    if (plan) view = std::move(trial);
    plans.push_back(std::move(plan));
  }
  return plans;
}

TxnCost hand_over_cost(const KeyLayout& keys, const WorkSpec& spec, const InstanceRecord& record) {
  const std::string work = keys.work(record.host, spec.uuid), instance = keys.instance(spec.uuid);
  const std::string claim = keys.claim(spec.uuid);
  const std::string view = keys.project_instance(spec.project, spec.uuid);
  // Compared: its work, record and claim keys, its host's disable, its project's record; written:
  // its work, its record and the project's view of it, and its claim erased.
  TxnCost cost{5, 4, 2 * (work.size() + instance.size() + claim.size()) + view.size() + encode(spec).size() +
                         2 * encode(record).size()};
  if (!spec.group.empty()) {
    constexpr size_t member_value = 128;  // host and policy
    cost.compares += 1;
    cost.ops += 1;
    cost.bytes += 2 * keys.group_member(spec.group, spec.uuid).size() + member_value;
  }
  return cost;
}

std::vector<std::vector<size_t>> split_by_project(const std::vector<std::string>& projects, size_t parts) {
  std::map<std::string, std::vector<size_t>> by_project;
  for (size_t i = 0; i < projects.size(); ++i) by_project[projects[i]].push_back(i);
  std::vector<std::vector<size_t>> groups;
  for (auto& [project, indexes] : by_project) groups.push_back(std::move(indexes));
  return pack_groups(std::move(groups), std::vector<size_t>(projects.size(), 1), parts);
}

std::vector<std::vector<size_t>> split_claims(const std::vector<std::vector<std::string>>& providers,
                                              const std::vector<size_t>& sizes, size_t parts) {
  // Requests linked through a provider, each group named by its first request.
  std::vector<size_t> group(providers.size());
  std::iota(group.begin(), group.end(), size_t(0));
  auto root = [&](size_t i) {
    while (group[i] != i) i = group[i] = group[group[i]];
    return i;
  };
  std::map<std::string, size_t> first_with;
  for (size_t i = 0; i < providers.size(); ++i)
    for (const std::string& rp : providers[i]) {
      auto [seen, fresh] = first_with.emplace(rp, i);
      if (fresh) continue;
      const size_t a = root(seen->second), b = root(i);
      group[std::max(a, b)] = std::min(a, b);
    }
  std::map<size_t, std::vector<size_t>> by_group;
  for (size_t i = 0; i < providers.size(); ++i) by_group[root(i)].push_back(i);
  std::vector<std::vector<size_t>> groups;
  for (auto& [first, indexes] : by_group) groups.push_back(std::move(indexes));
  return pack_groups(std::move(groups), sizes, parts);
}

}  // namespace toyvm
