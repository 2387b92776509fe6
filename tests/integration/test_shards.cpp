// A sharded cloud ([placement] shards): each schedule asks Placement about one shard first and
// the whole cloud when that shard has no room; with [placement] sample_hosts, a schedule of one
// instance asks about a few hosts at random before either. On simulated hosts (`toyvm compute --simulate`,
// the agent's own code on in-memory hypervisors), real Placement and etcd.

#include "harness.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"

#include "catch_result.hpp"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

using namespace toyvm;
using namespace toyvm::test;

namespace {

const std::string small = "resources=VCPU:1,DISK_GB:1,MEMORY_MB:256";

// `count` simulated hosts named <name>-00001..., started with `extra` arguments; waits until
// all have their host records. Their providers, by name.
std::map<std::string, std::string> start_simulated(const Servers& servers, std::vector<std::unique_ptr<Process>>& into,
                                                   const std::string& name, int count, const std::string& inventory,
                                                   std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"compute", "--simulate", std::to_string(count), "--state-dir",
                                servers.dir() + "/" + name, "--inventory", inventory, "--name", name};
  args.insert(args.end(), extra.begin(), extra.end());
  into.push_back(servers.spawn_toyvm(args, name + ".log"));
  std::map<std::string, std::string> providers;
  bool up = wait_for(
      [&] {
        providers.clear();
        for (int i = 1; i <= count; ++i) {
          const std::string host = fmt::format("{}-{:05d}", name, i);
          std::ifstream file(servers.dir() + "/" + name + "/" + host + "/provider_uuid");
          std::string uuid;
          if (!(file >> uuid) || servers.etcd_prefix(KeyLayout().host(uuid)).empty()) return false;
          providers[host] = uuid;
        }
        return true;
      },
      60);
  if (!up) throw std::runtime_error(name + ": the simulated hosts did not come up: " + into.back()->output());
  return providers;
}

// The provider's traits or aggregates (`what`) as Placement has them (its JSON body).
std::string provider_has(const Servers& servers, const std::string& provider, const std::string& what) {
  return run_sync<std::string>([&](asio::io_context& io) -> awaitable<std::string> {
    HttpClient http(io.get_executor(), servers.placement_http_options());
    HttpRequest request{"GET", "/resource_providers/" + provider + "/" + what,
                        {{"X-Auth-Token", "admin"}, {"OpenStack-API-Version", "placement 1.19"}}, {}};
    auto r = co_await http.request(std::move(request));
    if (!r || r->status != 200) throw std::runtime_error("reading " + what + " failed");
    co_return r->body;
  });
}

std::multiset<std::string> targets(const std::string& out) {
  std::multiset<std::string> hosts;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (auto [rp, uuid] = parse_notified(line); !rp.empty()) hosts.insert(rp);
  return hosts;
}

}  // namespace

TEST_CASE("a sharded cloud finds room wherever it is, never overbooks, and says no room only when there is none",
          "[shards]") {
  const bool sampled = GENERATE(false, true);
  Servers servers;
  std::string config = servers.dir() + "/shards.toml";
  std::ofstream(config) << "[placement]\nshards = 4\n" << (sampled ? "sample_hosts = 2\n" : "");
  ScopedEnv shards("TOYVM_CONFIG", config);
  std::vector<std::unique_ptr<Process>> agents;
  // Eight hosts with room for one instance each, in four shards of about two.
  auto hosts = start_simulated(servers, agents, "s", 8, "VCPU:1,DISK_GB:10,MEMORY_MB:1024");
  std::set<int> shards_used;
  for (const auto& [name, provider] : hosts) {
    const int shard = shard_of(provider, 4);
    shards_used.insert(shard);
    CHECK_THAT(provider_has(servers, provider, "traits"), Catch::Contains('"' + shard_trait(shard) + '"'));
    // Its shard among its traits, set with them: no aggregate to write.
    CHECK_THAT(provider_has(servers, provider, "aggregates"), Catch::Contains(R"("aggregates": [])"));
  }
  REQUIRE(shards_used.size() > 1);  // spread over shards, not all in one

  // One by one until every host is full: most schedules find their shard full by then.
  std::multiset<std::string> placed;
  std::vector<std::string> uuids;
  for (int i = 0; i < 8; ++i) {
    auto r = servers.toyvm({"-v", "schedule", small, "--wait"});
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    // The first asks about two hosts at random; the last finds room only by asking the cloud.
    CHECK((r.err.find("about 2 hosts at random") != std::string::npos) == sampled);
    auto [rp, uuid] = parse_notified(r.out);
    placed.insert(rp);
    uuids.push_back(uuid);
  }
  CHECK(std::set<std::string>(placed.begin(), placed.end()).size() == 8);
  auto full = servers.toyvm({"schedule", small});
  CHECK(full.exit_code == 1);
  CHECK(full.out == "NO ALLOCATIONS LEFT\n");
  for (const auto& [name, provider] : hosts) CHECK(servers.usages(provider)["VCPU"] == 1);

  // Room on two hosts only, wherever they are: a batch of two finds both.
  for (int i = 0; i < 2; ++i) REQUIRE(servers.toyvm({"destroy", uuids[size_t(i)]}).exit_code == 0);
  auto batch = servers.toyvm({"schedule", small, "--count", "2"});
  INFO(batch.out << batch.err);
  REQUIRE(batch.exit_code == 0);
  CHECK(targets(batch.out).size() == 2);
  for (const auto& [name, provider] : hosts) CHECK(servers.usages(provider)["VCPU"] == 1);
  CHECK(servers.toyvm({"audit"}).exit_code == 0);
}

TEST_CASE("a sharded cloud keeps hard group policies and zones exact", "[shards]") {
  Servers servers;
  std::string config = servers.dir() + "/shards.toml";
  // Groups and zones are never sampled: a sample seldom holds a zone's hosts or a group's.
  std::ofstream(config) << "[placement]\nshards = 4\nsample_hosts = 2\n";
  ScopedEnv shards("TOYVM_CONFIG", config);
  std::vector<std::unique_ptr<Process>> agents;
  auto zone_a = start_simulated(servers, agents, "a", 6, "VCPU:4,DISK_GB:40,MEMORY_MB:4096", {"--az", "zone-a"});
  auto zone_b = start_simulated(servers, agents, "b", 2, "VCPU:2,DISK_GB:20,MEMORY_MB:2048", {"--az", "zone-b"});
  std::set<std::string> in_b;
  for (const auto& [name, provider] : zone_b) in_b.insert(provider);

  SECTION("anti-affinity: one member per host, across shards, and none once every host has one") {
    std::set<std::string> used;
    for (int i = 0; i < 8; ++i) {
      auto r = servers.toyvm({"schedule", small, "--group", "apart", "--group-policy", "anti-affinity"});
      INFO(r.out << r.err);
      REQUIRE(r.exit_code == 0);
      used.insert(parse_notified(r.out).first);
    }
    CHECK(used.size() == 8);
    auto ninth = servers.toyvm({"schedule", small, "--group", "apart", "--group-policy", "anti-affinity"});
    CHECK(ninth.exit_code == 1);
  }
  SECTION("a zone's room is found in any shard, and only there") {
    for (int i = 0; i < 4; ++i) {
      auto r = servers.toyvm({"schedule", small, "--az", "zone-b"});
      INFO(r.out << r.err);
      REQUIRE(r.exit_code == 0);
      CHECK(in_b.count(parse_notified(r.out).first) == 1);
    }
    auto fifth = servers.toyvm({"schedule", small, "--az", "zone-b"});
    CHECK(fifth.exit_code == 1);  // zone-a has room: not for zone-b
    for (const std::string& provider : in_b) CHECK(servers.usages(provider)["VCPU"] == 2);
  }
}

TEST_CASE("an evacuation in a sharded cloud finds the one host with room, wherever it is", "[shards]") {
  Servers servers;
  std::string config = servers.dir() + "/shards.toml";
  std::ofstream(config) << "[placement]\nshards = 4\n";
  ScopedEnv shards("TOYVM_CONFIG", config);
  std::vector<std::unique_ptr<Process>> agents;
  auto hosts = start_simulated(servers, agents, "s", 8, "VCPU:1,DISK_GB:10,MEMORY_MB:1024");
  auto victim = start_simulated(servers, agents, "v", 1, "VCPU:1,DISK_GB:10,MEMORY_MB:1024");
  const std::string dead = victim.begin()->second;
  std::map<std::string, std::string> on;  // provider -> its instance
  for (int i = 0; i < 9; ++i) {
    auto r = servers.toyvm({"schedule", small, "--wait"});
    REQUIRE(r.exit_code == 0);
    auto [rp, uuid] = parse_notified(r.out);
    on[rp] = uuid;
  }
  REQUIRE(on.size() == 9);
  // Room on one host only, in whichever shard it is.
  const std::string free_host = hosts.begin()->second;
  REQUIRE(servers.toyvm({"destroy", on[free_host]}).exit_code == 0);
  agents.back()->signal(SIGKILL);
  agents.back()->wait(20);
  REQUIRE(wait_for([&] { return servers.etcd_prefix(KeyLayout().host(dead)).empty(); }, 60));

  auto evacuated = servers.toyvm({"evacuate", "v-00001"}, 60);
  INFO(evacuated.out << evacuated.err);
  CHECK(evacuated.exit_code == 0);
  CHECK(evacuated.out == fmt::format("EVACUATED INSTANCE {} TO {}\n", on[dead], free_host));
  CHECK(servers.allocations(on[dead]) == Allocations{{free_host, {{"VCPU", 1}, {"DISK_GB", 1}, {"MEMORY_MB", 256}}}});
  for (const auto& [name, provider] : hosts) CHECK(servers.usages(provider)["VCPU"] == 1);
  CHECK(wait_for([&] { return servers.toyvm({"audit"}).exit_code == 0; }, 20));
}
