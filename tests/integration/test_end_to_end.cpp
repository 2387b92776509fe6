// End to end against a real etcd, a real Placement (uWSGI, sqlite, noauth2) and libvirt's
// test driver inside each compute agent. Every test case gets servers of its own.

#include "harness.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"

#include "catch_result.hpp"
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <tuple>

using namespace toyvm;
using namespace toyvm::test;

namespace {

const std::string small = "resources=VCPU:1,DISK_GB:1,MEMORY_MB:256";


}  // namespace

TEST_CASE("schedule, show and destroy an instance end to end", "[e2e]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:4,DISK_GB:10,MEMORY_MB:1024", &rp);

  auto scheduled = servers.toyvm({"schedule", small, "--wait", "--name", "web1"});
  INFO(scheduled.err);
  REQUIRE(scheduled.exit_code == 0);
  auto [target, uuid] = parse_notified(scheduled.out);
  CHECK(target == rp);
  REQUIRE(!uuid.empty());
  CHECK_THAT(scheduled.out, Catch::Contains("INSTANCE " + uuid + " ACTIVE"));

  auto shown = servers.toyvm({"show", uuid, "--json"});
  REQUIRE(shown.exit_code == 0);
  auto record = decode_instance(shown.out);
  REQUIRE(record);
  CHECK(record->state == InstanceState::active);
  CHECK(record->host == rp);
  CHECK(record->name == "web1");
  CHECK_THAT(shown.out, Catch::Contains("\"error\":null"));
  CHECK_THAT(shown.out, Catch::Contains("\"ip\":"));

  Allocations expected{{rp, {{"VCPU", 1}, {"DISK_GB", 1}, {"MEMORY_MB", 256}}}};
  CHECK(servers.allocations(uuid) == expected);
  CHECK(servers.usages(rp)["VCPU"] == 1);
  CHECK(wait_for([&] { return published_domains(servers, rp) == 1; }, 10));

  auto listed = servers.toyvm({"show"});
  CHECK_THAT(listed.out, Catch::Contains(uuid));
  auto hosts = servers.toyvm({"show", "--hosts"});
  CHECK_THAT(hosts.out, Catch::Contains("c1"));
  CHECK_THAT(hosts.out, Catch::Contains("VCPU:4"));

  auto destroyed = servers.toyvm({"destroy", uuid});
  INFO(destroyed.err);
  REQUIRE(destroyed.exit_code == 0);
  CHECK(servers.allocations(uuid).empty());
  CHECK(servers.usages(rp)["VCPU"] == 0);
  CHECK(servers.etcd_prefix(KeyLayout().instance(uuid)).empty());
  CHECK(servers.etcd_prefix(KeyLayout().work(rp, uuid)).empty());
  CHECK(wait_for([&] { return published_domains(servers, rp) == 0; }, 10));
  CHECK(servers.toyvm({"show", uuid}).exit_code == 3);
}

TEST_CASE("one destroy of several instances destroys each it can, tells each failure, and exits with the first's",
          "[e2e]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:8,DISK_GB:10,MEMORY_MB:4096", &rp);
  std::vector<std::string> uuids;
  for (int i = 0; i < 3; ++i) {
    auto scheduled = servers.toyvm({"schedule", small, "--wait"});
    REQUIRE(scheduled.exit_code == 0);
    uuids.push_back(parse_notified(scheduled.out).second);
  }
  const std::string unknown = "00000000-0000-4000-8000-000000000000";
  const std::string corrupt = "11111111-1111-4111-8111-111111111111";
  servers.etcd_put(KeyLayout().instance(corrupt), "{not json");

  // One bad uuid among them: nothing is asked of anyone.
  auto invalid = servers.toyvm({"destroy", uuids[0], "../etc/passwd"});
  CHECK(invalid.exit_code == 2);
  CHECK(count_lines(invalid.err) == 1);
  CHECK_FALSE(servers.etcd_prefix(KeyLayout().instance(uuids[0])).empty());

  auto destroyed = servers.toyvm({"destroy", uuids[0], unknown, uuids[1], corrupt});
  INFO(destroyed.out << destroyed.err);
  CHECK(destroyed.exit_code == 3);  // the unknown one's, the first to fail
  CHECK_THAT(destroyed.out, Catch::Contains("DESTROYED INSTANCE " + uuids[0]) &&
                                Catch::Contains("DESTROYED INSTANCE " + uuids[1]));
  CHECK(count_lines(destroyed.err) == 2);
  CHECK_THAT(destroyed.err, Catch::Contains(unknown) && Catch::Contains(corrupt + ": ") && Catch::Contains("corrupt"));
  for (int i : {0, 1}) {
    CHECK(servers.etcd_prefix(KeyLayout().instance(uuids[i])).empty());
    CHECK(servers.allocations(uuids[i]).empty());
  }
  auto left = servers.etcd_prefix(KeyLayout().instance(uuids[2]));  // not asked, left alone
  REQUIRE(left.size() == 1);
  CHECK(decode_instance(left.front().value)->state == InstanceState::active);
  CHECK(servers.etcd_prefix(KeyLayout().instance(corrupt)).size() == 1);  // unknown is not absent
}

TEST_CASE("exhausted capacity says NO ALLOCATIONS LEFT and writes nothing", "[e2e]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:1,DISK_GB:10,MEMORY_MB:1024", &rp);
  REQUIRE(servers.toyvm({"schedule", small}).exit_code == 0);

  auto full = servers.toyvm({"schedule", small});
  CHECK(full.exit_code == 1);
  CHECK(full.out == "NO ALLOCATIONS LEFT\n");
  CHECK(servers.etcd_prefix(KeyLayout().instances_prefix()).size() == 1);
  CHECK(servers.etcd_prefix(KeyLayout().work_root()).size() == 1);
  CHECK(servers.usages(rp)["VCPU"] == 1);

  // The toy's own example: a trait that exists but no host has.
  auto impossible = servers.toyvm({"schedule", small + "&required=MISC_SHARES_VIA_AGGREGATE"});
  CHECK(impossible.exit_code == 1);
  CHECK(impossible.out == "NO ALLOCATIONS LEFT\n");

  // A trait Placement has never heard of is a mistake in the query, said as such.
  auto unknown = servers.toyvm({"schedule", small + "&required=CUSTOM_NOWHERE"});
  CHECK(unknown.exit_code == 2);
  CHECK_THAT(unknown.err, Catch::Contains("CUSTOM_NOWHERE"));
  CHECK(unknown.out.empty());
}

TEST_CASE("a required trait picks only the host that has it", "[e2e]") {
  Servers servers;
  std::string plain, fast;
  auto c1 = servers.start_compute("plain", "VCPU:8,DISK_GB:10,MEMORY_MB:4096", &plain);
  auto c2 = servers.start_compute("fast", "VCPU:8,DISK_GB:10,MEMORY_MB:4096", &fast, {"--trait", "CUSTOM_FAST"});
  for (int i = 0; i < 4; ++i) {
    auto result = servers.toyvm({"schedule", small + "&required=CUSTOM_FAST"});
    REQUIRE(result.exit_code == 0);
    CHECK(parse_notified(result.out).first == fast);
  }
  CHECK(servers.usages(fast)["VCPU"] == 4);
  CHECK(servers.usages(plain)["VCPU"] == 0);
  auto forbidden = servers.toyvm({"schedule", small + "&required=!CUSTOM_FAST"});
  REQUIRE(forbidden.exit_code == 0);
  CHECK(parse_notified(forbidden.out).first == plain);
}

namespace {

// 20 concurrent `toyvm schedule` processes for room for 10 on two hosts.
void race_for_ten(Servers& servers, int host_subset_size) {
  std::string a, b;
  auto c1 = servers.start_compute("a", "VCPU:5,DISK_GB:100,MEMORY_MB:8192", &a);
  auto c2 = servers.start_compute("b", "VCPU:5,DISK_GB:100,MEMORY_MB:8192", &b);
  std::string config = servers.dir() + "/schedule.toml";
  std::ofstream(config) << "[schedule]\nhost_subset_size = " << host_subset_size << "\n";

  std::vector<std::unique_ptr<Process>> schedulers;
  for (int i = 0; i < 20; ++i)
    schedulers.push_back(
        servers.spawn_toyvm({"--config", config, "schedule", small}, "sched-" + std::to_string(i) + ".log"));
  int won = 0, full = 0;
  for (auto& p : schedulers) {
    int code = p->wait(120);
    INFO(p->output());
    if (code == 0) {
      ++won;
      CHECK(!parse_notified(p->output()).second.empty());
    } else {
      CHECK(code == 1);
      CHECK_THAT(p->output(), Catch::Contains("NO ALLOCATIONS LEFT"));
      ++full;
    }
  }
  CHECK(won == 10);
  CHECK(full == 10);
  CHECK(servers.usages(a)["VCPU"] <= 5);
  CHECK(servers.usages(b)["VCPU"] <= 5);
  CHECK(servers.usages(a)["VCPU"] + servers.usages(b)["VCPU"] == 10);
  CHECK(servers.etcd_prefix(KeyLayout().instances_prefix()).size() == 10);
  CHECK(servers.etcd_prefix(KeyLayout().work_root()).size() == 10);
}

}  // namespace

TEST_CASE("20 concurrent schedules for room for 10: exactly 10 win, nothing overbooked", "[e2e]") {
  const int subset = GENERATE(1, 3);  // host_subset_size: 3 randomises among the best hosts
  INFO("host_subset_size " << subset);
  Servers servers;
  race_for_ten(servers, subset);
}

TEST_CASE("the same race against Placement on PostgreSQL with four workers", "[e2e]") {
  Servers servers(ServersOptions{.postgresql = true, .placement_workers = 4});
  race_for_ten(servers, 1);
}

TEST_CASE("a restarted compute keeps its provider and its instances", "[e2e]") {
  Servers servers;
  std::string first;
  auto compute = servers.start_compute("c1", "VCPU:4,DISK_GB:10,MEMORY_MB:1024", &first);
  auto scheduled = servers.toyvm({"schedule", small, "--wait"});
  REQUIRE(scheduled.exit_code == 0);
  std::string uuid = parse_notified(scheduled.out).second;

  compute->signal(SIGTERM);
  CHECK(compute->wait(20) == 0);
  // A clean stop revokes the lease: the host record is gone at once.
  CHECK(servers.etcd_prefix(KeyLayout().host(first)).empty());

  std::string second;
  compute = servers.start_compute("c1", "VCPU:4,DISK_GB:10,MEMORY_MB:1024", &second);
  CHECK(second == first);
  CHECK(servers.provider_count() == 1);
  CHECK_THAT(wait_for_state(servers, uuid, "ACTIVE"), Catch::Contains("ACTIVE"));
  CHECK(wait_for([&] { return published_domains(servers, first) == 1; }, 10));
  CHECK(servers.usages(first)["VCPU"] == 1);
}

TEST_CASE("bad input gets one clear line and a non-zero exit, and writes nothing", "[e2e][errors]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:4,DISK_GB:10,MEMORY_MB:1024", &rp);

  SECTION("malformed query") {
    auto r = servers.toyvm({"schedule", "resources=VCPU:one"});
    CHECK(r.exit_code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK_THAT(r.err, Catch::Contains("VCPU:one"));
    CHECK(r.out.empty());
  }
  SECTION("unknown and invalid uuids") {
    const std::string unknown = "00000000-0000-4000-8000-000000000000";
    auto show = servers.toyvm({"show", unknown});
    CHECK(show.exit_code == 3);
    CHECK(count_lines(show.err) == 1);
    CHECK_THAT(show.err, Catch::Contains(unknown));
    auto destroy = servers.toyvm({"destroy", unknown});
    CHECK(destroy.exit_code == 3);
    CHECK(count_lines(destroy.err) == 1);
    auto invalid = servers.toyvm({"destroy", "../etc/passwd"});
    CHECK(invalid.exit_code == 2);
    CHECK(count_lines(invalid.err) == 1);
  }
  SECTION("a corrupt record in etcd is reported, not a crash") {
    const std::string uuid = "11111111-1111-4111-8111-111111111111";
    servers.etcd_put(KeyLayout().instance(uuid), "{not json");
    auto show = servers.toyvm({"show", uuid});
    CHECK(show.exit_code == 5);
    CHECK_THAT(show.err, Catch::Contains("corrupt"));
    CHECK(servers.toyvm({"show"}).exit_code == 0);
    // Garbage under the host's work prefix is skipped by the agent, which keeps serving.
    servers.etcd_put(KeyLayout().work(rp, uuid), "garbage");
    auto after = servers.toyvm({"schedule", small, "--wait"});
    CHECK(after.exit_code == 0);
    CHECK(compute->running());
  }
  SECTION("endpoints without a scheme are bad usage, not an unreachable server") {
    const std::string etcd = servers.config.etcd.endpoints.front();
    const std::string placement = servers.config.placement.endpoint;
    const std::string bare_placement = placement.substr(placement.find("://") + 3);
    const std::string bare_etcd = etcd.substr(etcd.find("://") + 3);
    for (auto [etcd_flag, placement_flag, named] : {std::tuple{etcd, bare_placement, bare_placement},
                                                    std::tuple{bare_etcd, placement, bare_etcd}}) {
      auto r = run_command({toyvm_binary(), "--etcd", etcd_flag, "--placement", placement_flag, "schedule", small},
                           servers.dir());
      CHECK(r.exit_code == 2);
      CHECK(count_lines(r.err) == 1);
      CHECK_THAT(r.err, Catch::Contains("'" + named + "'") && Catch::Contains("http://"));
    }
    CHECK(servers.usages(rp)["VCPU"] == 0);
  }
  SECTION("Placement down") {
    servers.stop_placement();
    auto r = servers.toyvm({"schedule", small});
    CHECK(r.exit_code == 4);
    CHECK(count_lines(r.err) == 1);
    CHECK_THAT(r.err, Catch::Contains("Placement"));
    CHECK(servers.etcd_prefix(KeyLayout().instances_prefix()).empty());
  }
  SECTION("etcd down") {
    servers.stop_etcd();
    auto r = servers.toyvm({"schedule", small});
    CHECK(r.exit_code == 4);
    CHECK(count_lines(r.err) == 1);
    CHECK_THAT(r.err, Catch::Contains("etcd"));
    CHECK(servers.usages(rp)["VCPU"] == 0);  // no claim was left behind
    auto show = servers.toyvm({"show"});
    CHECK(show.exit_code == 4);
    CHECK(count_lines(show.err) == 1);
  }
}
