// Crashes, restarts and unavailable hosts, against a real etcd and Placement.

#include "harness.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"

#include "catch_result.hpp"

#include <fmt/format.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <set>

using namespace toyvm;
using namespace toyvm::test;
namespace fs = std::filesystem;

namespace {

const std::string small = "resources=VCPU:1,DISK_GB:1,MEMORY_MB:64";
const std::string roomy = "VCPU:1000,DISK_GB:10000,MEMORY_MB:100000";

int active_instances(const Servers& servers) {
  int n = 0;
  for (const KeyValue& kv : servers.etcd_prefix(KeyLayout().instances_prefix())) {
    auto record = decode_instance(kv.value);
    n += record && record->state == InstanceState::active;
  }
  return n;
}


// A config with a short lease, so a killed agent's host record expires within the test.
std::string short_lease_config(const Servers& servers) {
  std::string path = servers.dir() + "/short-lease.toml";
  std::ofstream(path) << "[compute]\nlease_ttl = 2\n";
  return path;
}

}  // namespace

TEST_CASE("kill -9 during 100 schedules: every instance ACTIVE exactly once, nothing leaked", "[recovery]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  std::vector<std::string> args{"compute", "--state-dir", servers.dir() + "/c1", "--libvirt-uri", "test:///default",
                                "--inventory", roomy, "--name", "c1"};
  int succeeded = 0;
  for (int wave = 0; wave < 10; ++wave) {
    if (wave == 3) compute->signal(SIGKILL);  // its host record lives on until the lease expires
    if (wave == 6) compute = servers.spawn_toyvm(args, "c1-restarted.log");
    std::vector<std::unique_ptr<Process>> schedulers;
    for (int i = 0; i < 10; ++i)
      schedulers.push_back(servers.spawn_toyvm({"schedule", small}, "s" + std::to_string(wave * 10 + i) + ".log"));
    for (auto& p : schedulers) succeeded += p->wait(60) == 0;
  }
  REQUIRE(succeeded > 60);  // schedules after the lease expired may find no live host
  CHECK(wait_for([&] { return active_instances(servers) == succeeded; }, 60));
  CHECK(wait_for([&] { return published_domains(servers, rp) == succeeded; }, 30));  // one domain each, no doubles
  CHECK(servers.usages(rp)["VCPU"] == succeeded);  // no leaked allocations
  CHECK(int(servers.etcd_prefix(KeyLayout().work_prefix(rp)).size()) == succeeded);
}

TEST_CASE("work handed to a stopped agent is done when it starts", "[recovery]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  compute->signal(SIGKILL);
  compute->wait();
  std::vector<std::string> uuids;
  for (int i = 0; i < 3; ++i) {
    auto r = servers.toyvm({"schedule", small});  // the host record has not expired yet
    REQUIRE(r.exit_code == 0);
    uuids.push_back(parse_notified(r.out).second);
  }
  CHECK(active_instances(servers) == 0);
  compute = servers.spawn_toyvm({"compute", "--state-dir", servers.dir() + "/c1", "--libvirt-uri",
                                 "test:///default", "--inventory", roomy, "--name", "c1"}, "c1-again.log");
  for (const std::string& uuid : uuids) CHECK_THAT(wait_for_state(servers, uuid, "ACTIVE"), Catch::Contains("ACTIVE"));
  CHECK(wait_for([&] { return published_domains(servers, rp) == 3; }, 20));
}

TEST_CASE("stopped, dead and full hosts are skipped", "[recovery]") {
  Servers servers;
  std::string config = short_lease_config(servers);
  std::string good, other;
  auto c_good = servers.start_compute("good", roomy, &good, {});
  auto c_other = servers.start_compute("other", roomy, &other, {});

  SECTION("a cleanly stopped agent marks its provider disabled; starting again clears it") {
    c_other->signal(SIGTERM);
    REQUIRE(c_other->wait(20) == 0);
    auto traits = run_sync<std::vector<std::string>>([&](asio::io_context& io) -> awaitable<std::vector<std::string>> {
      PlacementClient placement(io.get_executor(), servers.config.placement);
      auto t = co_await placement.traits(other);
      co_return t ? *t : std::vector<std::string>{};
    });
    CHECK(std::find(traits.begin(), traits.end(), "COMPUTE_STATUS_DISABLED") != traits.end());
    for (int i = 0; i < 3; ++i) CHECK(parse_notified(servers.toyvm({"schedule", small}).out).first == good);
    c_other = servers.start_compute("other", roomy, &other, {});
    traits = run_sync<std::vector<std::string>>([&](asio::io_context& io) -> awaitable<std::vector<std::string>> {
      PlacementClient placement(io.get_executor(), servers.config.placement);
      auto t = co_await placement.traits(other);
      co_return t ? *t : std::vector<std::string>{};
    });
    CHECK(std::find(traits.begin(), traits.end(), "COMPUTE_STATUS_DISABLED") == traits.end());
  }
  SECTION("a dead agent's host record expires with its lease") {
    std::string dead;
    auto c_dead = servers.spawn_toyvm({"--config", config, "compute", "--state-dir", servers.dir() + "/dead",
                                       "--libvirt-uri", "test:///default", "--inventory", roomy, "--name", "dead"},
                                      "dead.log");
    REQUIRE(wait_for([&] { return read_file(servers.dir() + "/dead/provider_uuid").size() >= 36; }, 20));
    dead = read_file(servers.dir() + "/dead/provider_uuid").substr(0, 36);
    REQUIRE(wait_for([&] { return host_record(servers, dead).has_value(); }, 20));
    c_dead->signal(SIGKILL);
    CHECK(wait_for([&] { return !host_record(servers, dead).has_value(); }, 20));
    for (int i = 0; i < 4; ++i) CHECK(parse_notified(servers.toyvm({"schedule", small}).out).first != dead);
  }
  SECTION("a FULL host is not chosen, and work beyond its limit is refused") {
    std::string full;
    auto c_full = servers.start_compute("full", roomy, &full, {"--max-instances", "2", "--trait", "CUSTOM_LIMITED"});
    for (int i = 0; i < 2; ++i)
      REQUIRE(servers.toyvm({"schedule", small + "&required=CUSTOM_LIMITED", "--wait"}).exit_code == 0);
    CHECK(wait_for([&] { auto h = host_record(servers, full); return h && h->status == "FULL"; }, 10));
    auto refused = servers.toyvm({"schedule", small + "&required=CUSTOM_LIMITED"});
    CHECK(refused.exit_code == 1);
    CHECK(refused.out == "NO ALLOCATIONS LEFT\n");
    CHECK(servers.usages(full)["VCPU"] == 2);
  }
}

TEST_CASE("destroy --force cleans up an instance whose host is gone", "[recovery]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  auto scheduled = servers.toyvm({"schedule", small, "--wait", "--group", "g", "--group-policy", "anti-affinity"});
  REQUIRE(scheduled.exit_code == 0);
  std::string uuid = parse_notified(scheduled.out).second;
  compute->signal(SIGKILL);
  compute->wait();

  auto forced = servers.toyvm({"destroy", uuid, "--force"});
  INFO(forced.err);
  CHECK(forced.exit_code == 0);
  CHECK(servers.allocations(uuid).empty());
  CHECK(servers.etcd_prefix(KeyLayout().instance(uuid)).empty());
  CHECK(servers.etcd_prefix(KeyLayout().work(rp, uuid)).empty());
  CHECK(servers.etcd_prefix(KeyLayout().group_prefix("g")).empty());
  CHECK(servers.toyvm({"destroy", uuid, "--force"}).exit_code == 3);
}

TEST_CASE("destroy --force that loses a race with an evacuation leaves the moved instance whole", "[recovery]") {
  Servers servers;
  std::string rp, other;
  auto compute = servers.start_compute("c1", roomy, &rp, {}, "lease_ttl = 2\n");
  const std::string uuid = parse_notified(servers.toyvm({"schedule", small, "--wait"}).out).second;
  REQUIRE(!uuid.empty());
  auto compute2 = servers.start_compute("c2", roomy, &other);
  compute->signal(SIGKILL);
  compute->wait();
  REQUIRE(wait_for([&] { return !host_record(servers, rp).has_value(); }, 30));

  // destroy --force reads the instance on c1, and waits there while an evacuation moves it.
  const std::string paused = servers.dir() + "/force-paused";
  auto forced = servers.spawn_toyvm_paused("destroy.force", paused, {"-v", "destroy", uuid, "--force"}, "forced.log");
  auto evacuated = servers.toyvm({"evacuate", "c1"});
  INFO(evacuated.out << evacuated.err);
  REQUIRE(evacuated.exit_code == 0);
  fs::remove(paused);
  CHECK(forced->wait(30) == 5);
  CHECK_THAT(forced->output(), Catch::Contains("changed while it was being destroyed"));

  // It runs on c2, holding its resources there, its keys whole.
  CHECK(wait_for_record(servers, uuid, [&](const InstanceRecord& r) {
    return r.host == other && r.state == InstanceState::active;
  }));
  CHECK(servers.allocations(uuid).count(other) == 1);
  CHECK(servers.etcd_prefix(KeyLayout().work(other, uuid)).size() == 1);
  CHECK(servers.toyvm({"audit"}).exit_code == 0);
}

TEST_CASE("Placement down during a destroy: the release happens once it is back", "[recovery]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  auto scheduled = servers.toyvm({"schedule", small, "--wait"});
  REQUIRE(scheduled.exit_code == 0);
  std::string uuid = parse_notified(scheduled.out).second;

  servers.stop_placement();
  auto destroying = servers.spawn_toyvm({"destroy", uuid, "--timeout", "120"}, "destroy.log");
  // The agent cannot release, so it keeps the keys: nothing is forgotten.
  CHECK(wait_for([&] { return read_file(servers.dir() + "/c1.log").find("will retry") != std::string::npos; }, 20));
  CHECK_FALSE(servers.etcd_prefix(KeyLayout().instance(uuid)).empty());
  servers.start_placement_again();
  CHECK(destroying->wait(120) == 0);
  CHECK(servers.allocations(uuid).empty());
  CHECK(servers.usages(rp)["VCPU"] == 0);
  CHECK(servers.etcd_prefix(KeyLayout().instance(uuid)).empty());
}

TEST_CASE("etcd restarted during a burst: nothing lost, agents reconnect", "[recovery]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  int succeeded = 0;
  for (int wave = 0; wave < 6; ++wave) {
    if (wave == 3) {
      servers.stop_etcd();
      servers.start_etcd_again();
    }
    std::vector<std::unique_ptr<Process>> schedulers;
    for (int i = 0; i < 5; ++i)
      schedulers.push_back(servers.spawn_toyvm({"schedule", small}, "e" + std::to_string(wave * 5 + i) + ".log"));
    for (auto& p : schedulers) succeeded += p->wait(60) == 0;
  }
  CHECK(succeeded >= 15);  // schedules while etcd was down fail cleanly; the rest must all run
  CHECK(wait_for([&] { return active_instances(servers) == succeeded; }, 60));
  CHECK(wait_for([&] { return published_domains(servers, rp) == succeeded; }, 60));
  CHECK(servers.usages(rp)["VCPU"] == succeeded);
  CHECK(compute->running());
}

TEST_CASE("a 3-member etcd cluster loses its leader in a burst: nothing lost, no duplicate", "[recovery]") {
  Servers servers(ServersOptions{.etcd_members = 3});
  std::string a, b;
  auto ca = servers.start_compute("a", roomy, &a);
  auto cb = servers.start_compute("b", roomy, &b);
  int succeeded = 0;
  for (int wave = 0; wave < 6; ++wave) {
    if (wave == 3) servers.kill_etcd_leader();
    std::vector<std::unique_ptr<Process>> schedulers;
    for (int i = 0; i < 5; ++i)
      schedulers.push_back(servers.spawn_toyvm({"schedule", small}, "l" + std::to_string(wave * 5 + i) + ".log"));
    for (auto& p : schedulers) succeeded += p->wait(60) == 0;
  }
  CHECK(succeeded >= 15);  // an election takes a moment; schedules in it may fail cleanly
  CHECK(wait_for([&] { return active_instances(servers) == succeeded; }, 60));
  CHECK(wait_for([&] { return published_domains(servers, a) + published_domains(servers, b) == succeeded; }, 60));
  CHECK(servers.usages(a)["VCPU"] + servers.usages(b)["VCPU"] == succeeded);
  CHECK(ca->running());
  CHECK(cb->running());
}

TEST_CASE("a host that keeps failing builds: instances move to a healthy one, or end no_valid_host", "[recovery]") {
  Servers servers;
  // libvirt refuses a domain of an unknown virt type: every build on this host fails.
  std::string broken_config = servers.dir() + "/broken.toml";
  std::ofstream(broken_config) << "[compute]\ndomain_type = \"bogus\"\nmax_build_attempts = 2\n";
  std::string broken;
  auto c_broken = servers.spawn_toyvm({"--config", broken_config, "compute", "--state-dir", servers.dir() + "/broken",
                                       "--libvirt-uri", "test:///default", "--inventory",
                                       "VCPU:100,DISK_GB:1000,MEMORY_MB:100000", "--name", "broken"},
                                      "broken.log");
  REQUIRE(wait_for([&] { return read_file(servers.dir() + "/broken/provider_uuid").size() >= 36; }, 20));
  broken = read_file(servers.dir() + "/broken/provider_uuid").substr(0, 36);
  REQUIRE(wait_for([&] { return host_record(servers, broken).has_value(); }, 20));

  SECTION("alone, it gives up after the attempt limit with nothing held") {
    auto r = servers.toyvm({"schedule", small, "--wait"});
    CHECK(r.exit_code == 5);
    std::string uuid = parse_notified(r.out).second;
    CHECK_THAT(r.err, Catch::Contains("no_valid_host"));
    CHECK(servers.allocations(uuid).empty());
    CHECK(servers.usages(broken)["VCPU"] == 0);
  }
  SECTION("with a healthy host, every instance ends ACTIVE there") {
    std::string healthy;
    auto c_healthy = servers.start_compute("healthy", "VCPU:10,DISK_GB:1000,MEMORY_MB:100000", &healthy);
    // Spread prefers the emptier broken host first.
    for (int i = 0; i < 4; ++i) {
      auto r = servers.toyvm({"schedule", small, "--wait"});
      INFO(r.out << r.err);
      CHECK(r.exit_code == 0);
      std::string uuid = parse_notified(r.out).second;
      CHECK(servers.allocations(uuid).count(healthy) == 1);
    }
    CHECK(servers.usages(broken)["VCPU"] == 0);
    CHECK(servers.usages(healthy)["VCPU"] == 4);
    CHECK(servers.etcd_prefix(KeyLayout().work_prefix(broken)).empty());
  }
}

TEST_CASE("an ERROR instance stays ERROR and holds nothing after its agent is killed, even once its image exists",
          "[recovery]") {
  Servers servers;
  std::string images = servers.dir() + "/images";
  fs::create_directories(images);
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp, {}, "image_dir = '" + images + "'\n");
  auto scheduled = servers.toyvm({"schedule", small, "--image", "later.raw", "--wait"});
  CHECK(scheduled.exit_code == 5);
  std::string uuid = parse_notified(scheduled.out).second;
  REQUIRE(!uuid.empty());
  CHECK(servers.allocations(uuid).empty());

  std::ofstream(images + "/later.raw", std::ios::binary) << std::string(4096, 'x');
  compute->signal(SIGKILL);
  compute->wait();
  compute = servers.spawn_toyvm({"--config", servers.dir() + "/c1.toml", "compute", "--state-dir", servers.dir() + "/c1",
                                 "--libvirt-uri", "test:///default", "--inventory", roomy, "--name", "c1"},
                                "c1-restarted.log");
  // The restarted agent reads what it recorded and gives back (again) what ERROR holds.
  CHECK(wait_for([&] { return compute->output().find(uuid + ": ERROR; its allocation is released") != std::string::npos; },
                 30));
  auto record = wait_for_record(servers, uuid, [](const InstanceRecord&) { return true; });
  REQUIRE(record);
  CHECK(record->state == InstanceState::error);
  CHECK(record->error_code == "image_failure");
  CHECK(servers.allocations(uuid).empty());
  CHECK(servers.usages(rp)["VCPU"] == 0);
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
}

TEST_CASE("a build that fails while Placement is down gives its allocation back once Placement is back",
          "[recovery]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  auto stalling = std::make_unique<StallingServer>(servers.dir() + "/stall.log");
  auto scheduled = servers.toyvm({"schedule", small, "--image", stalling->url()});
  REQUIRE(scheduled.exit_code == 0);
  std::string uuid = parse_notified(scheduled.out).second;
  REQUIRE(wait_for_record(servers, uuid, [](const InstanceRecord& r) { return r.state == InstanceState::building; }));

  servers.stop_placement();
  stalling.reset();  // the download breaks off: image_failure, while the release cannot happen
  auto failed = wait_for_record(servers, uuid, [](const InstanceRecord& r) { return r.state == InstanceState::error; });
  REQUIRE(failed);
  CHECK(wait_for([&] { return compute->output().find("will retry") != std::string::npos; }, 20));
  servers.start_placement_again();
  CHECK(wait_for([&] { return servers.allocations(uuid).empty(); }, 30));
  CHECK(servers.usages(rp)["VCPU"] == 0);
  CHECK(compute->running());
}

TEST_CASE("an agent whose state dir was wiped takes its provider back by name, with its instances", "[recovery]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp, {}, "lease_ttl = 2\n");
  auto scheduled = servers.toyvm({"schedule", small, "--wait"});
  REQUIRE(scheduled.exit_code == 0);
  std::string uuid = parse_notified(scheduled.out).second;
  compute->signal(SIGKILL);
  compute->wait();
  fs::remove_all(servers.dir() + "/c1");  // its config file stays beside it

  std::string again;
  compute = servers.start_compute("c1", roomy, &again, {}, "lease_ttl = 2\n");
  CHECK(again == rp);
  CHECK(servers.provider_count() == 1);
  CHECK_THAT(compute->output(), Catch::Contains("taking it again"));
  // Its domain went with the old process (the test driver): it is built again, here.
  CHECK(wait_for([&] { return compute->output().find("instance " + uuid + ": active") != std::string::npos; }, 30));
  CHECK(servers.usages(rp)["VCPU"] == 1);
  CHECK(servers.toyvm({"audit"}).exit_code == 0);
}

TEST_CASE("etcd members given by name: the others answer when the first is down", "[recovery]") {
  Servers servers(ServersOptions{.etcd_members = 3});
  std::vector<std::string> named;
  for (std::string endpoint : servers.config.etcd.endpoints)
    named.push_back(endpoint.replace(endpoint.find("127.0.0.1"), 9, "LOCALHOST"));  // a name, resolved
  servers.stop_etcd_member(0);
  // Once the others agree on a leader (the first may have been it), they answer.
  CommandResult shown;
  CHECK(wait_for([&] {
    shown = run_command({toyvm_binary(), "--etcd", fmt::format("{}", fmt::join(named, ",")), "--placement",
                         servers.config.placement.endpoint, "show", "--hosts"},
                        servers.dir(), 30);
    return shown.exit_code == 0;
  }, 30));
  INFO(shown.err);
  CHECK_THAT(shown.out, Catch::Contains("NAME"));
}
