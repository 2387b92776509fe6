#include "model/keys.hpp"

#include "catch_result.hpp"

#include <map>
#include <set>

using namespace toyvm;

namespace {
const std::string rp = "853557e9-7dc3-438c-9239-f54b9673f509";
const std::string vm = "7387cdc8-291c-4b02-87ce-895f460b7a80";
}  // namespace

TEST_CASE("the key layout keeps hosts, work and instances apart") {
  KeyLayout keys;
  CHECK(keys.host(rp) == "/toyvm/v1/hosts/" + rp);
  CHECK(keys.work(rp, vm) == "/toyvm/v1/work/" + rp + "/" + vm);
  CHECK(keys.work_prefix(rp) == "/toyvm/v1/work/" + rp + "/");
  CHECK(keys.instance(vm) == "/toyvm/v1/instances/" + vm);
}

TEST_CASE("a custom prefix loses its trailing slash") {
  KeyLayout keys("/test/abc/");
  CHECK(keys.instance(vm) == "/test/abc/instances/" + vm);
}

TEST_CASE("work keys parse back; anything else does not") {
  KeyLayout keys;
  auto parsed = keys.parse_work(keys.work(rp, vm));
  REQUIRE(parsed);
  CHECK(parsed->host == rp);
  CHECK(parsed->instance == vm);
  CHECK_FALSE(keys.parse_work(keys.instance(vm)));
  CHECK_FALSE(keys.parse_work("/toyvm/v1/work/" + rp));
  CHECK_FALSE(keys.parse_work("/toyvm/v1/work/" + rp + "/not-a-uuid"));
  CHECK_FALSE(keys.parse_work("/toyvm/v1/work/" + rp + "/" + vm + "/extra"));
}

TEST_CASE("domain keys parse back; a work key is not one") {
  KeyLayout keys;
  CHECK(keys.domain(rp, vm) == "/toyvm/v1/domains/" + rp + "/" + vm);
  CHECK(keys.domains_prefix(rp) == "/toyvm/v1/domains/" + rp + "/");
  auto parsed = keys.parse_domain(keys.domain(rp, vm));
  REQUIRE(parsed);
  CHECK(parsed->host == rp);
  CHECK(parsed->instance == vm);
  CHECK_FALSE(keys.parse_domain(keys.work(rp, vm)));
  CHECK_FALSE(keys.parse_domain("/toyvm/v1/domains/" + rp));
}

TEST_CASE("prefix range ends cover exactly the prefix") {
  CHECK(prefix_range_end("/a/") == "/a0");
  CHECK(prefix_range_end("ab\xff") == "ac");
  CHECK(prefix_range_end("") == std::string(1, '\0'));
}

#include "model/uuid.hpp"

TEST_CASE("an availability zone maps to one aggregate uuid everywhere") {
  CHECK(availability_zone_aggregate("zone-a") == availability_zone_aggregate("zone-a"));
  CHECK(availability_zone_aggregate("zone-a") != availability_zone_aggregate("zone-b"));
  CHECK(is_uuid(availability_zone_aggregate("zone-a")));
  CHECK(availability_zone_aggregate("zone-a")[14] == '5');  // a name-based (SHA-1) uuid
}

TEST_CASE("hosts fall into shards evenly and the same way everywhere; each shard is one aggregate") {
  std::map<int, int> hosts_in;
  for (int i = 0; i < 10'000; ++i) {
    const std::string provider = new_uuid();
    const int shard = shard_of(provider, 100);
    CHECK(shard == shard_of(provider, 100));
    REQUIRE(shard >= 0);
    REQUIRE(shard < 100);
    hosts_in[shard] += 1;
  }
  CHECK(hosts_in.size() == 100);
  for (const auto& [shard, hosts] : hosts_in) {
    CHECK(hosts > 50);  // 100 each on average
    CHECK(hosts < 150);
  }
  CHECK(shard_of("2a3ef9c5-b66e-4f96-b3b1-903723b7b9b8", 0) == 0);  // no shards: one
  CHECK(shard_of("2a3ef9c5-b66e-4f96-b3b1-903723b7b9b8", 1) == 0);
  CHECK(shard_trait(7) == "CUSTOM_TOYVM_SHARD_7");  // Placement's custom trait syntax
  CHECK(shard_trait(7) != shard_trait(8));
  CHECK(is_shard_trait(shard_trait(7)));
  CHECK_FALSE(is_shard_trait("CUSTOM_TOYVM_HOST"));
}

TEST_CASE("new uuids are random version 4 uuids, never repeated") {
  std::set<std::string> seen;
  for (int i = 0; i < 10'000; ++i) {
    std::string uuid = new_uuid();
    REQUIRE(is_uuid(uuid));
    CHECK(uuid[14] == '4');
    CHECK(std::string("89ab").find(uuid[19]) != std::string::npos);  // the RFC 4122 variant
    seen.insert(uuid);
  }
  CHECK(seen.size() == 10'000);
  CHECK(random_seed() != random_seed());
}

TEST_CASE("an instance's keys are listed in one place: work, record, membership, console copies, usage, move") {
  KeyLayout keys("/p");
  using Range = KeyLayout::Range;
  const std::vector<Range> alone{{"/p/work/rp/i-1", ""},
                                 {"/p/instances/i-1", ""},
                                 {"/p/project-instances/team-a/i-1", ""},
                                 {"/p/console/team-a/i-1/", "/p/console/team-a/i-10"},
                                 {"/p/usage/i-1", ""},
                                 {"/p/moves/i-1", ""}};
  CHECK(keys.instance_keys("rp", "i-1", "", "team-a") == alone);
  CHECK(keys.record_keys("team-a", "i-1") == std::vector<std::string>{"/p/instances/i-1", "/p/project-instances/team-a/i-1"});
  std::vector<Range> grouped = alone;
  grouped.push_back({"/p/groups/web/i-1", ""});
  CHECK(keys.instance_keys("rp", "i-1", "web", "team-a") == grouped);
}

TEST_CASE("a group membership key names its group and its instance") {
  KeyLayout keys("/p");
  const std::string uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";
  auto member = keys.parse_group_member(keys.group_member("web", uuid));
  REQUIRE(member);
  CHECK(member->group == "web");
  CHECK(member->instance == uuid);
  CHECK_FALSE(keys.parse_group_member(keys.group_member("web", "i-1")));
  CHECK_FALSE(keys.parse_group_member("/p/groups/web"));
  CHECK_FALSE(keys.parse_group_member("/p/work/rp/i-1"));
}
