// Weighing and batches against a real Placement and etcd.

#include "harness.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"

#include "catch_result.hpp"

#include <fstream>
#include <map>
#include <set>
#include <sstream>

using namespace toyvm;
using namespace toyvm::test;

namespace {

const std::string small = "resources=VCPU:1,DISK_GB:1,MEMORY_MB:256";

std::vector<std::string> targets(const std::string& out) {
  std::vector<std::string> hosts;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    auto [rp, uuid] = parse_notified(line);
    if (!rp.empty()) hosts.push_back(rp);
  }
  return hosts;
}

}  // namespace

TEST_CASE("pack fills one host before the next; spread balances", "[scheduling]") {
  Servers servers;
  std::string a, b;
  auto ca = servers.start_compute("a", "VCPU:3,DISK_GB:100,MEMORY_MB:8192", &a);
  auto cb = servers.start_compute("b", "VCPU:3,DISK_GB:100,MEMORY_MB:8192", &b);

  SECTION("pack") {
    std::vector<std::string> order;
    for (int i = 0; i < 6; ++i) {
      auto r = servers.toyvm({"schedule", small, "--policy", "pack"});
      REQUIRE(r.exit_code == 0);
      order.push_back(parse_notified(r.out).first);
    }
    // The first host to be used is filled (3 VCPU) before the other gets anything.
    CHECK(order[0] == order[1]);
    CHECK(order[1] == order[2]);
    CHECK(order[3] != order[0]);
    CHECK(order[4] == order[3]);
  }
  SECTION("spread") {
    std::map<std::string, int> per_host;
    for (int i = 0; i < 6; ++i) {
      auto r = servers.toyvm({"schedule", small});
      REQUIRE(r.exit_code == 0);
      per_host[parse_notified(r.out).first] += 1;
      int most = 0, least = 1 << 30;
      for (auto& h : {a, b}) {
        most = std::max(most, per_host[h]);
        least = std::min(least, per_host[h]);
      }
      CHECK(most - least <= 1);  // within one instance per host at every step
    }
  }
}

TEST_CASE("--count places all or nothing", "[scheduling]") {
  Servers servers;
  std::string a, b;
  auto ca = servers.start_compute("a", "VCPU:5,DISK_GB:100,MEMORY_MB:8192", &a);
  auto cb = servers.start_compute("b", "VCPU:4,DISK_GB:100,MEMORY_MB:8192", &b);

  auto too_many = servers.toyvm({"schedule", small, "--count", "10"});
  CHECK(too_many.exit_code == 1);
  CHECK(too_many.out == "NO ALLOCATIONS LEFT\n");
  CHECK(servers.usages(a)["VCPU"] == 0);
  CHECK(servers.usages(b)["VCPU"] == 0);
  CHECK(servers.etcd_prefix(KeyLayout().instances_prefix()).empty());

  auto fits = servers.toyvm({"schedule", small, "--count", "9", "--name", "web", "--wait"});
  INFO(fits.err);
  REQUIRE(fits.exit_code == 0);
  auto hosts = targets(fits.out);
  CHECK(hosts.size() == 9);
  CHECK(std::count(hosts.begin(), hosts.end(), a) == 5);
  CHECK(std::count(hosts.begin(), hosts.end(), b) == 4);
  CHECK(servers.usages(a)["VCPU"] == 5);
  CHECK(servers.usages(b)["VCPU"] == 4);
  CHECK(servers.etcd_prefix(KeyLayout().instances_prefix()).size() == 9);
  CHECK(std::count(fits.out.begin(), fits.out.end(), '\n') >= 9 + 9);  // NOTIFIED, then ACTIVE each
}

TEST_CASE("a batch with big user data is handed over in as many transactions as etcd's limits need",
          "[scheduling]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:100,DISK_GB:1000,MEMORY_MB:100000", &rp);
  // 64 KiB of user data each: 20 of them are over etcd's 1.5 MiB for one request.
  const std::string user_data = servers.dir() + "/user-data";
  std::ofstream(user_data) << "#cloud-config\n# " << std::string(64 * 1024 - 20, 'x') << "\n";
  auto batch = servers.toyvm({"schedule", small, "--count", "20", "--user-data", user_data}, 120);
  INFO(batch.err);
  CHECK(batch.exit_code == 0);
  CHECK(targets(batch.out).size() == 20);
  CHECK(servers.etcd_prefix(KeyLayout().work_prefix(rp)).size() == 20);
  CHECK(servers.usages(rp)["VCPU"] == 20);
  auto audit = servers.toyvm({"audit"});
  INFO(audit.out);
  CHECK(audit.exit_code == 0);

  // An instance that could never go through etcd is refused before anything is claimed.
  const std::string key_file = servers.dir() + "/key.pub";
  std::ofstream(key_file) << "ssh-ed25519 " << std::string(15000, 'A') << " big\n";
  std::vector<std::string> args{"schedule", small};
  for (int i = 0; i < 80; ++i) args.insert(args.end(), {"--key-file", key_file});
  auto refused = servers.toyvm(args);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.err, Catch::Contains("more than etcd takes in one request"));
  CHECK(servers.usages(rp)["VCPU"] == 20);
  CHECK(servers.etcd_prefix(KeyLayout().instances_prefix()).size() == 20);
}

TEST_CASE("availability zones and CPU traits pick only matching hosts", "[scheduling]") {
  Servers servers;
  std::string east, west;
  auto ce = servers.start_compute("east", "VCPU:8,DISK_GB:100,MEMORY_MB:8192", &east, {"--az", "east"});
  auto cw = servers.start_compute("west", "VCPU:8,DISK_GB:100,MEMORY_MB:8192", &west, {"--az", "west"});
  for (int i = 0; i < 3; ++i) {
    auto r = servers.toyvm({"schedule", small, "--az", "west"});
    REQUIRE(r.exit_code == 0);
    CHECK(parse_notified(r.out).first == west);
  }
  auto nowhere = servers.toyvm({"schedule", small, "--az", "north"});
  CHECK(nowhere.exit_code == 1);
  CHECK(nowhere.out == "NO ALLOCATIONS LEFT\n");

  // Its moves keep to its zone: the emptier host east is no place for one scheduled west.
  std::string west2;
  auto cw2 = servers.start_compute("west2", "VCPU:8,DISK_GB:100,MEMORY_MB:8192", &west2, {"--az", "west"});
  auto placed = servers.toyvm({"schedule", small, "--az", "west", "--wait"}, 60);
  REQUIRE(placed.exit_code == 0);
  auto [from, uuid] = parse_notified(placed.out);
  const std::string to = from == west ? west2 : west;
  auto moving = servers.toyvm({"migrate", uuid, "--no-wait"});
  INFO(moving.out << moving.err);
  CHECK(moving.out == "MIGRATING INSTANCE " + uuid + " TO " + to + "\n");
  // Nor can it be sent there by name.
  REQUIRE(wait_for([&] { return servers.etcd_prefix(KeyLayout().move(uuid)).empty(); }, 60));
  auto named = servers.toyvm({"migrate", uuid, "--host", "east", "--no-wait"});
  CHECK(named.out == "NO ALLOCATIONS LEFT\n");

  // Every x86-64 CPU has SSE2; agents report it from /proc/cpuinfo.
  auto sse2 = servers.toyvm({"schedule", small + "&required=HW_CPU_X86_SSE2"});
  CHECK(sse2.exit_code == 0);
  auto none = servers.toyvm({"schedule", small + "&required=!HW_CPU_X86_SSE2"});
  CHECK(none.exit_code == 1);
}

TEST_CASE("server groups: anti-affinity under concurrency, affinity, and policy clashes", "[scheduling]") {
  Servers servers;
  std::vector<std::unique_ptr<Process>> computes;
  std::vector<std::string> providers;
  for (int i = 0; i < 5; ++i) {
    std::string rp;
    computes.push_back(servers.start_compute("h" + std::to_string(i), "VCPU:4,DISK_GB:100,MEMORY_MB:8192", &rp));
    providers.push_back(rp);
  }

  SECTION("5 concurrent members of an anti-affinity group land on 5 hosts, or fail cleanly") {
    std::vector<std::unique_ptr<Process>> schedulers;
    for (int i = 0; i < 5; ++i)
      schedulers.push_back(servers.spawn_toyvm({"schedule", small, "--group", "apart", "--group-policy",
                                                "anti-affinity", "--wait"}, "g" + std::to_string(i) + ".log"));
    std::set<std::string> active_hosts;
    int active = 0;
    for (auto& p : schedulers) {
      int code = p->wait(60);
      std::string out = p->output();
      INFO(out);
      auto [rp, uuid] = parse_notified(out);
      if (code == 0) {
        ++active;
        // Where it runs now: a member the late check refused may have moved to another host.
        auto shown = decode_instance(servers.toyvm({"show", uuid, "--json"}).out);
        REQUIRE(shown.has_value());
        active_hosts.insert(shown->host);
      } else {
        // The late check refused it: ERROR no_valid_host, and nothing held in Placement.
        CHECK(code == 5);
        CHECK_THAT(out, Catch::Contains("no_valid_host"));
        if (!uuid.empty()) CHECK(servers.allocations(uuid).empty());
      }
    }
    CHECK(active >= 1);
    CHECK(int(active_hosts.size()) == active);  // never two on one host
  }
  SECTION("affinity keeps a group together; a clashing policy is refused") {
    std::set<std::string> hosts;
    for (int i = 0; i < 3; ++i) {
      auto r = servers.toyvm({"schedule", small, "--group", "together", "--group-policy", "affinity"});
      REQUIRE(r.exit_code == 0);
      hosts.insert(parse_notified(r.out).first);
    }
    CHECK(hosts.size() == 1);
    auto clash = servers.toyvm({"schedule", small, "--group", "together", "--group-policy", "anti-affinity"});
    CHECK(clash.exit_code == 2);
    CHECK_THAT(clash.err, Catch::Contains("policy affinity"));
    auto bad = servers.toyvm({"schedule", small, "--group", "../x"});
    CHECK(bad.exit_code == 2);
  }
  SECTION("a batch of an anti-affinity group spreads over distinct hosts, or fails whole") {
    auto r = servers.toyvm({"schedule", small, "--count", "5", "--group", "batch", "--group-policy", "anti-affinity"});
    REQUIRE(r.exit_code == 0);
    auto hosts = targets(r.out);
    CHECK(std::set<std::string>(hosts.begin(), hosts.end()).size() == 5);
    auto sixth = servers.toyvm({"schedule", small, "--group", "batch", "--group-policy", "anti-affinity"});
    CHECK(sixth.exit_code == 1);
  }
}

TEST_CASE("batches place beyond candidate_limit, concurrent batches that fit all place, the last room goes to one",
          "[scheduling]") {
  Servers servers;
  std::vector<std::unique_ptr<Process>> agents;
  std::vector<std::string> hosts(8);
  for (size_t i = 0; i < hosts.size(); ++i)
    agents.push_back(servers.start_compute("h" + std::to_string(i), "VCPU:4,DISK_GB:100,MEMORY_MB:8192", &hosts[i]));
  // Placement shows each schedule 3 of the 8 hosts unless it asks for more.
  std::string config = servers.dir() + "/few-candidates.toml";
  std::ofstream(config) << "[placement]\ncandidate_limit = 3\n";
  auto schedule = [&](int count, const std::string& log) {
    return servers.spawn_toyvm({"--config", config, "schedule", small, "--count", std::to_string(count)}, log);
  };
  auto placed = [&](Process& process) { return targets(process.output()).size(); };
  auto within_capacity = [&] {
    for (const std::string& host : hosts)
      if (servers.usages(host)["VCPU"] > 4) return false;
    return true;
  };

  auto alone = schedule(14, "alone.log");
  CHECK(alone->wait(60) == 0);
  CHECK(placed(*alone) == 14);

  // 18 free: three batches of 6 at once all fit, and all are placed.
  std::vector<std::unique_ptr<Process>> together;
  for (int i = 0; i < 3; ++i) together.push_back(schedule(6, "together-" + std::to_string(i) + ".log"));
  for (auto& batch : together) {
    INFO(batch->output());
    CHECK(batch->wait(60) == 0);
    CHECK(placed(*batch) == 6);
  }
  CHECK(within_capacity());

  // 2 free, released by a destroy; two batches of 2 want them: one wins, and the other
  // says NO ALLOCATIONS LEFT, which is true by then.
  std::vector<std::string> uuids;
  for (const KeyValue& kv : servers.etcd_prefix(KeyLayout().instances_prefix()))
    uuids.push_back(kv.key.substr(kv.key.rfind('/') + 1));
  REQUIRE(uuids.size() == 32);
  REQUIRE(servers.toyvm({"destroy", uuids[0]}).exit_code == 0);
  REQUIRE(servers.toyvm({"destroy", uuids[1]}).exit_code == 0);
  auto first = schedule(2, "last-1.log");
  auto second = schedule(2, "last-2.log");
  int a = first->wait(60), b = second->wait(60);
  INFO(first->output() << second->output());
  CHECK(((a == 0 && b == 1) || (a == 1 && b == 0)));
  CHECK(placed(*first) + placed(*second) == 2);
  CHECK((first->output().find("NO ALLOCATIONS LEFT") != std::string::npos) == (a == 1));
  CHECK(within_capacity());
  CHECK(servers.toyvm({"audit"}).exit_code == 0);
}
