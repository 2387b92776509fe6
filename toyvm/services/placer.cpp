#include "services/placer.hpp"

#include "model/records.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>

namespace toyvm {

using namespace asio::experimental::awaitable_operators;

awaitable<result<PlacementView>> Placer::look(PlacementQuery query, std::string group, std::string moving) {
  // Stopped agents mark their providers so (microversion 1.39 lets `required` repeat).
  query.params.emplace_back("required", "!COMPUTE_STATUS_DISABLED");
  auto [candidates, hosts] = co_await (
      placement_.allocation_candidates(query.to_query_string(config_.placement.candidate_limit)) &&
      etcd_.range_prefix(keys_.hosts_prefix()));
  if (!hosts) co_return hosts.error();
  if (!candidates) co_return candidates.error();
  PlacementView view;
  view.candidates = std::move(*candidates);
  for (const KeyValue& kv : hosts->kvs) {
    auto host = decode_host(kv.value);
    if (host && host->status == "READY") view.live.insert(host->provider);
  }
  if (!group.empty()) {
    auto members = co_await etcd_.range_prefix(keys_.group_prefix(group));
    if (!members) co_return members.error();
    for (const KeyValue& kv : members->kvs) {
      auto member = decode_group_member(kv.value);
      if (!member || keys_.leaf(kv.key, keys_.group_prefix(group)) == moving) continue;
      view.group_members[member->host] += 1;
      view.group_policies.insert(member->policy);
    }
  }
  co_return view;
}

std::vector<Choice> Placer::rank(const PlacementView& view, const WeighPolicy& policy, double random,
                                 std::optional<GroupPolicy> group) const {
  std::vector<Choice> ranked = rank_candidates(view.candidates, view.live, policy, random);
  if (group) ranked = filter_for_group(std::move(ranked), *group, view.group_members);
  return ranked;
}

awaitable<result<Claim>> Placer::claim_first_fit(std::string uuid, std::vector<Choice> choices) {
  for (const Choice& choice : choices) {
    for (int attempt = 1; attempt <= config_.schedule.max_claim_attempts; ++attempt) {
      auto claimed = co_await placement_.claim(uuid, *choice.allocations);
      if (claimed) co_return Claim{choice.host, *choice.allocations};
      if (claimed.error() == errc::placement_concurrent_update) continue;
      if (claimed.error() == errc::placement_capacity) break;
      co_return claimed.error();
    }
  }
  co_return make_error_code(errc::no_allocations_left);
}

WeighPolicy Placer::weigh_policy(const std::string& policy_name) const {
  const ScheduleConfig& c = config_.schedule;
  WeighPolicy policy;
  policy.kind = parse_weigh_kind(policy_name.empty() ? c.policy : policy_name).value_or(WeighPolicy::Kind::spread);
  policy.ram_multiplier = c.ram_weight_multiplier;
  policy.cpu_multiplier = c.cpu_weight_multiplier;
  policy.disk_multiplier = c.disk_weight_multiplier;
  policy.host_subset_size = c.host_subset_size;
  return policy;
}

}  // namespace toyvm
