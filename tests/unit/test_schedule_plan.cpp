#include "services/schedule_plan.hpp"

#include <catch2/catch.hpp>

#include <map>
#include <random>

using namespace toyvm;

namespace {

// Hosts with room for `slots` instances of 2 VCPU each, one candidate per host.
PlacementView hosts(const std::vector<std::string>& names, int slots) {
  PlacementView view;
  for (const std::string& name : names) {
    view.candidates.allocation_requests.push_back(Allocations{{name, {{"VCPU", 2}}}});
    view.candidates.provider_summaries[name] = ProviderSummary{{{"VCPU", 2 * slots}}, {{"VCPU", 0}}};
    view.live.insert(name);
  }
  return view;
}

std::map<std::string, int> per_host(const std::vector<Claim>& plan) {
  std::map<std::string, int> count;
  for (const Claim& claim : plan) count[claim.host] += 1;
  return count;
}

}  // namespace

TEST_CASE("a batch is planned against the capacity it uses up itself") {
  std::mt19937_64 rng{1};
  WeighPolicy spread;
  auto plan = plan_batch(hosts({"a", "b"}, 2), 4, spread, std::nullopt, rng);
  REQUIRE(plan);
  CHECK(per_host(*plan) == std::map<std::string, int>{{"a", 2}, {"b", 2}});
  for (const Claim& claim : *plan) CHECK(claim.allocations.at(claim.host).at("VCPU") == 2);
  // One more than fits: nothing, not a partial plan.
  CHECK_FALSE(plan_batch(hosts({"a", "b"}, 2), 5, spread, std::nullopt, rng));
}

TEST_CASE("a batch spreads or packs as the policy says, and keeps to its group's policy") {
  std::mt19937_64 rng{1};
  WeighPolicy spread, pack;
  pack.kind = WeighPolicy::Kind::pack;
  auto spread_plan = plan_batch(hosts({"a", "b"}, 4), 2, spread, std::nullopt, rng);
  REQUIRE(spread_plan);
  CHECK(per_host(*spread_plan).size() == 2);
  auto packed = plan_batch(hosts({"a", "b"}, 4), 2, pack, std::nullopt, rng);
  REQUIRE(packed);
  CHECK(per_host(*packed).size() == 1);
  // Anti-affinity: one member per host, however much room each has.
  CHECK_FALSE(plan_batch(hosts({"a", "b"}, 4), 3, pack, GroupPolicy::anti_affinity, rng));
  auto apart = plan_batch(hosts({"a", "b"}, 4), 2, pack, GroupPolicy::anti_affinity, rng);
  REQUIRE(apart);
  CHECK(per_host(*apart).size() == 2);
}

TEST_CASE("requests that arrived together are planned in turn, each all or nothing") {
  std::mt19937_64 rng{1};
  WeighPolicy spread;
  // Room for 5: 2 + 3 fit, and the next two find none left.
  auto plans = plan_requests(hosts({"a", "b", "c", "d", "e"}, 1), {2, 3, 2, 1}, spread, rng);
  REQUIRE(plans.size() == 4);
  REQUIRE(plans[0]);
  REQUIRE(plans[1]);
  CHECK_FALSE(plans[2]);
  CHECK_FALSE(plans[3]);
  std::map<std::string, int> used = per_host(*plans[0]);
  for (const auto& [host, n] : per_host(*plans[1])) used[host] += n;
  CHECK(used == std::map<std::string, int>{{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}, {"e", 1}});
  // A request too big for what is left does not take the room of a smaller one after it.
  auto second = plan_requests(hosts({"a", "b"}, 1), {3, 1, 1}, spread, rng);
  CHECK_FALSE(second[0]);
  CHECK(second[1]);
  CHECK(second[2]);
  CHECK(per_host(*second[1]) != per_host(*second[2]));
}

TEST_CASE("handing an instance over costs five compares and four writes, one more of each with a group") {
  KeyLayout keys("/p");
  WorkSpec spec;
  spec.uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";
  InstanceRecord record;
  record.uuid = spec.uuid;
  record.host = "d578fb7c-7787-4e73-b69a-a7b3ef9bf73a";
  TxnCost alone = hand_over_cost(keys, spec, record);
  CHECK(alone.compares == 5);
  CHECK(alone.ops == 4);
  CHECK(alone.bytes > encode(spec).size() + encode(record).size());
  spec.group = "web";
  TxnCost grouped = hand_over_cost(keys, spec, record);
  CHECK(grouped.compares == 6);
  CHECK(grouped.ops == 5);
  CHECK(grouped.bytes > alone.bytes);
}

TEST_CASE("requests that waited together are shared among batches by project, each project whole in one") {
  using Batches = std::vector<std::vector<size_t>>;
  CHECK(split_by_project({}, 2).empty());
  CHECK(split_by_project({"a", "a", "a"}, 2) == Batches{{0, 1, 2}});  // one project: one batch
  CHECK(split_by_project({"a", "b", "a", "b"}, 1) == Batches{{0, 1, 2, 3}});
  CHECK(split_by_project({"a", "b", "a", "b"}, 2) == Batches{{0, 2}, {1, 3}});
  // The biggest project first; the others fill the smaller batch, each in its requests' order.
  CHECK(split_by_project({"c", "a", "a", "b", "a", "a"}, 2) == Batches{{1, 2, 4, 5}, {0, 3}});
  // Never more batches than projects, none empty.
  CHECK(split_by_project({"a", "b"}, 4) == Batches{{0}, {1}});
}

TEST_CASE("a batch's claims are split only where they touch no provider in common") {
  using Parts = std::vector<std::vector<size_t>>;
  CHECK(split_claims({}, {}, 2).empty());
  // One instance each on four hosts: two parts of two hosts.
  CHECK(split_claims({{"a"}, {"b"}, {"c"}, {"d"}}, {1, 1, 1, 1}, 2) == Parts{{0, 2}, {1, 3}});
  // Requests on the same host stay together; the heavier group first.
  CHECK(split_claims({{"a"}, {"b"}, {"a"}, {"a"}}, {1, 1, 1, 1}, 2) == Parts{{0, 2, 3}, {1}});
  // Linked through a provider (a request on two hosts, a shared provider), transitively.
  CHECK(split_claims({{"a", "b"}, {"c"}, {"b", "s"}, {"d", "s"}}, {1, 1, 1, 1}, 2) == Parts{{0, 2, 3}, {1}});
  CHECK(split_claims({{"a"}, {"b"}, {"c"}, {"a", "c"}}, {1, 1, 1, 1}, 4) == Parts{{0, 2, 3}, {1}});
  // Weighed by instances: a request of three against three of one.
  CHECK(split_claims({{"a"}, {"b"}, {"c"}, {"d"}}, {3, 1, 1, 1}, 2) == Parts{{0}, {1, 2, 3}});
  // One part: everything in it.
  CHECK(split_claims({{"a"}, {"b"}}, {1, 1}, 1) == Parts{{0, 1}});
}
