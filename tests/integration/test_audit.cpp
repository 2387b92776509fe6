// toyvm audit against real etcd and Placement, with libvirt's test driver in the agent.

#include "harness.hpp"
#include "model/inventory.hpp"
#include "model/keys.hpp"
#include "model/moves.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"
#include "services/placer.hpp"

#include "catch_result.hpp"

#include <signal.h>

#include <filesystem>
#include <fstream>

using namespace toyvm;
using namespace toyvm::test;
namespace fs = std::filesystem;

namespace {

const std::string small = "resources=VCPU:1,DISK_GB:1,MEMORY_MB:64";

std::string schedule_one(const Servers& servers, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"schedule", small, "--wait"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = servers.toyvm(args);
  REQUIRE(r.exit_code == 0);
  return parse_notified(r.out).second;
}

}  // namespace

TEST_CASE("audit: clean books, then each planted discrepancy found and the unambiguous ones fixed", "[audit]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:8,DISK_GB:100,MEMORY_MB:4096", &rp, {}, "lease_ttl = 2\n");
  schedule_one(servers);
  std::string grouped = schedule_one(servers, {"--group", "web"});
  // The agent publishes its domains once its work is done.
  REQUIRE(wait_for([&] { return published_domains(servers, rp) == 2; }, 10));
  auto clean = servers.toyvm({"audit"});
  INFO(clean.out << clean.err);
  CHECK(clean.exit_code == 0);
  CHECK_THAT(clean.out, Catch::Contains("clean"));

  // A claim nobody handed over, and a group member whose instance is gone.
  const std::string leaked = new_uuid();
  servers.claim(leaked, Allocations{{rp, {{"VCPU", 1}, {"MEMORY_MB", 64}}}});
  const std::string gone = new_uuid();
  servers.etcd_put(KeyLayout().group_member("web", gone), R"({"host":")" + rp + R"(","policy":"anti-affinity"})");
  auto dirty = servers.toyvm({"audit", "--json"});
  INFO(dirty.out << dirty.err);
  CHECK(dirty.exit_code == 1);
  CHECK_THAT(dirty.out, Catch::Contains("\"allocation_without_instance\"") && Catch::Contains(leaked));
  CHECK_THAT(dirty.out, Catch::Contains("\"member_without_instance\"") && Catch::Contains(gone));

  auto fixed = servers.toyvm({"audit", "--fix", "--grace", "0.2"});
  INFO(fixed.out << fixed.err);
  CHECK(fixed.exit_code == 0);
  CHECK_THAT(fixed.out, Catch::Contains("2 discrepancies, 2 fixed"));
  CHECK(servers.allocations(leaked).empty());
  CHECK(servers.etcd_prefix(KeyLayout().group_member("web", gone)).empty());
  CHECK_FALSE(servers.etcd_prefix(KeyLayout().group_member("web", grouped)).empty());
  CHECK(servers.toyvm({"audit"}).exit_code == 0);

  // Work whose agent died, and an instance that holds nothing: found, not guessed at.
  servers.claim(leaked, Allocations{{rp, {{"VCPU", 1}}}});
  compute->signal(SIGKILL);
  compute->wait();
  REQUIRE(wait_for([&] { return servers.etcd_prefix(KeyLayout().host(rp)).empty(); }, 30));
  auto dead = servers.toyvm({"audit", "--fix", "--grace", "0.2"});
  INFO(dead.out << dead.err);
  CHECK(dead.exit_code == 1);
  CHECK_THAT(dead.out, Catch::Contains("work_on_dead_host") && Catch::Contains(grouped));
  CHECK_THAT(dead.out, Catch::Contains("allocation_without_instance") && Catch::Contains("(fixed)"));
  CHECK(servers.allocations(leaked).empty());
  CHECK_FALSE(servers.allocations(grouped).empty());  // the dead host's instance keeps its claim
}

TEST_CASE("audit --fix leaves another service's providers and consumers in the same Placement alone", "[audit]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:8,DISK_GB:100,MEMORY_MB:4096", &rp);
  schedule_one(servers);
  // Another service, as Nova's compute nodes and servers would be: its own provider and
  // project, one server there and one on toyvm's host.
  PlacementConfig nova = servers.config.placement;
  nova.consumer_project = "6b3c9a7e0e5d4c4f9d1a2b3c4d5e6f70";
  nova.consumer_user = "nova";
  const std::string node = new_uuid(), on_node = new_uuid(), on_toyvm = new_uuid();
  const bool made = run_sync<bool>([&](asio::io_context& io) -> awaitable<bool> {
    PlacementClient placement(io.get_executor(), nova);
    Inventory inventory = inventory_from_amounts({{"VCPU", 16}, {"MEMORY_MB", 8192}});
    Allocations there{{node, {{"VCPU", 2}}}}, here{{rp, {{"VCPU", 1}}}};
    auto provider = co_await placement.ensure_provider(node, "nova-compute-1");
    auto stocked = co_await placement.set_inventory(node, std::move(inventory));
    ConsumerOwner owner{nova.consumer_project, nova.consumer_user};
    auto first = co_await placement.claim(on_node, std::move(there), owner);
    auto second = co_await placement.claim(on_toyvm, std::move(here), owner);
    co_return provider && stocked && first && second;
  });
  REQUIRE(made);
  // Its node has the room toyvm's host lacks, and is still no candidate: it is not toyvm's.
  auto big = servers.toyvm({"schedule", "resources=VCPU:12"});
  INFO(big.out << big.err);
  CHECK(big.exit_code == 1);
  CHECK_THAT(big.out, Catch::Contains("NO ALLOCATIONS LEFT"));
  // And a leak of toyvm's own, which it does fix.
  const std::string leaked = new_uuid();
  servers.claim(leaked, Allocations{{rp, {{"VCPU", 1}}}});

  auto fixed = servers.toyvm({"audit", "--fix", "--grace", "0.2"});
  INFO(fixed.out << fixed.err);
  CHECK(fixed.exit_code == 0);
  CHECK_THAT(fixed.out, Catch::Contains(leaked) && !Catch::Contains(on_node) && !Catch::Contains(on_toyvm));
  CHECK(servers.allocations(leaked).empty());
  CHECK(servers.allocations(on_node).count(node) == 1);
  CHECK(servers.allocations(on_toyvm).count(rp) == 1);
  CHECK(servers.toyvm({"audit"}).exit_code == 0);
}

namespace {

bool paused_at(const Process& process, const std::string& point) {
  return process.output().find("failpoint " + point + ": paused") != std::string::npos;
}

size_t held_claims(const Servers& servers) { return servers.etcd_prefix(KeyLayout().claims_prefix()).size(); }
size_t schedule_holds(const Servers& servers) { return servers.etcd_prefix(KeyLayout().holds_prefix()).size(); }

}  // namespace

TEST_CASE("audit --fix leaves a running schedule's claims alone, and gives back a dead one's once its hold lapses",
          "[audit]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:8,DISK_GB:100,MEMORY_MB:4096", &rp);
  // Two schedules that claimed and wait before handing over, as a slow etcd would make them.
  const std::string paused = servers.dir() + "/schedules-paused";
  std::ofstream(paused) << "";
  std::unique_ptr<Process> slow, dead;
  {
    ScopedEnv failpoints("TOYVM_FAILPOINTS", "schedule.hand_over=pause(" + paused + ")");
    slow = servers.spawn_toyvm({"-v", "schedule", small, "--count", "3"}, "slow.log");
    dead = servers.spawn_toyvm({"-v", "schedule", small}, "dead.log");
  }
  REQUIRE(wait_for([&] { return paused_at(*slow, "schedule.hand_over") && paused_at(*dead, "schedule.hand_over"); }, 20));
  CHECK(held_claims(servers) == 4);
  CHECK(schedule_holds(servers) == 2);  // one a schedule, however many it claims for
  REQUIRE(servers.usages(rp)["VCPU"] == 4);

  // Claims without instances, seen in both looks: on their way, not leaks.
  auto during = servers.toyvm({"audit", "--fix", "--grace", "0.2"});
  INFO(during.out << during.err);
  CHECK(during.exit_code == 0);
  CHECK_THAT(during.out, Catch::Contains("clean"));
  CHECK(servers.usages(rp)["VCPU"] == 4);

  // One schedule dies there. Once its hold lapses nothing can hand its claim over: given back.
  dead->signal(SIGKILL);
  dead->wait();
  CHECK(held_claims(servers) == 4);  // its hold stays until its deadline has passed
  REQUIRE(wait_for([&] { return servers.toyvm({"audit"}).out.find("allocation_without_instance") != std::string::npos; },
                   40));
  auto after = servers.toyvm({"audit", "--fix", "--grace", "0.2"});
  INFO(after.out << after.err);
  CHECK(after.exit_code == 0);
  CHECK_THAT(after.out, Catch::Contains("allocation_without_instance") && Catch::Contains("(fixed)"));
  CHECK(servers.usages(rp)["VCPU"] == 3);
  CHECK(held_claims(servers) == 3);  // its claim's key erased before its claim was given back
  CHECK_THAT(after.out, Catch::Contains("schedule_hold_lapsed"));
  CHECK(schedule_holds(servers) == 1);  // and its hold, which nothing names any more

  // The other goes on: its three instances handed over with their claims, its hold let go.
  fs::remove(paused);
  CHECK(slow->wait(30) == 0);
  CHECK(count_of(slow->output(), "NOTIFIED TARGET") == 3);
  CHECK(held_claims(servers) == 0);
  CHECK(schedule_holds(servers) == 0);  // erased with its last claims
  REQUIRE(wait_for([&] { return published_domains(servers, rp) == 3; }, 20));
  auto clean = servers.toyvm({"audit"});
  INFO(clean.out << clean.err);
  CHECK(clean.exit_code == 0);
}

TEST_CASE("a schedule whose hold lapsed hands nothing over and gives its claim back", "[audit]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:8,DISK_GB:100,MEMORY_MB:4096", &rp);
  const std::string paused = servers.dir() + "/schedule-paused";
  auto schedule = servers.spawn_toyvm_paused("schedule.hand_over", paused, {"-v", "schedule", small}, "schedule.log");
  // What `audit --fix` does to a hold past its deadline (etcd out of the schedule's reach).
  auto held = servers.etcd_prefix(KeyLayout().claims_prefix());
  REQUIRE(held.size() == 1);
  servers.etcd_erase(held.front().key);
  fs::remove(paused);
  CHECK(schedule->wait(30) == 4);
  CHECK_THAT(schedule->output(), Catch::Contains("hold on its claims lapsed"));
  CHECK(servers.usages(rp)["VCPU"] == 0);
  CHECK(servers.etcd_prefix(KeyLayout().holds_prefix()).empty());  // let go of as it gave up
  CHECK(servers.etcd_prefix(KeyLayout().instances_prefix()).empty());
  CHECK(servers.toyvm({"audit"}).exit_code == 0);
}

TEST_CASE("audit --fix releases only what the consumer still holds as it last read it", "[audit]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:8,DISK_GB:100,MEMORY_MB:4096", &rp);
  const std::string leaked = new_uuid();
  servers.claim(leaked, Allocations{{rp, {{"VCPU", 1}}}});
  const std::string paused = servers.dir() + "/audit-paused";
  auto audit = servers.spawn_toyvm_paused("audit.fix", paused, {"-v", "audit", "--fix", "--grace", "0.2"}, "audit.log");
  // Between its look and its fix, the consumer's allocations change.
  const bool changed = run_sync<bool>([&](asio::io_context& io) -> awaitable<bool> {
    PlacementClient placement(io.get_executor(), servers.config.placement);
    auto read = co_await placement.consumer_allocations(leaked);
    if (!read || !read->generation) co_return false;
    Allocations more{{rp, {{"VCPU", 2}}}};
    auto replaced = co_await placement.replace(leaked, std::move(more), *read->generation, read->owner);
    co_return bool(replaced);
  });
  REQUIRE(changed);
  fs::remove(paused);
  CHECK(audit->wait(30) == 1);
  CHECK_THAT(audit->output(), Catch::Contains("allocation_without_instance") && !Catch::Contains("(fixed)"));
  CHECK(servers.allocations(leaked)[rp]["VCPU"] == 2);
}

TEST_CASE("audit: Placement or etcd down is exit 4 with one line", "[audit]") {
  Servers servers;
  servers.stop_placement();
  auto r = servers.toyvm({"audit"});
  CHECK(r.exit_code == 4);
  CHECK(count_lines(r.err) == 1);
  CHECK_THAT(r.err, Catch::Contains("Placement"));
}

TEST_CASE("a move's books in the real Placement: its migration consumer holds the source until the move ends",
          "[audit]") {
  Servers servers;
  std::string a, b;
  auto on_a = servers.start_compute("c1", "VCPU:4,DISK_GB:10,MEMORY_MB:1024", &a);
  auto on_b = servers.start_compute("c2", "VCPU:4,DISK_GB:10,MEMORY_MB:1024", &b);
  const std::string uuid = new_uuid(), migration = new_uuid();
  const ResourceAmounts size{{"VCPU", 2}, {"MEMORY_MB", 256}};
  servers.claim(uuid, Allocations{{a, size}});
  using Move = Placer::Move;
  // One step of the placer's against the real Placement; its outcome, or -1 for an error.
  auto step = [&](std::function<awaitable<int>(Placer&, PlacementClient&)> body) {
    return run_sync<int>([&](asio::io_context& io) -> awaitable<int> {
      PlacementClient placement(io.get_executor(), servers.config.placement);
      auto etcd = EtcdClient::create(servers.config.etcd);
      Placer placer(placement, *etcd, servers.config);
      co_return co_await body(placer, placement);
    });
  };
  auto begin = [&](ResourceAmounts wanted) {
    return step([&](Placer& placer, PlacementClient& placement) -> awaitable<int> {
      auto held = co_await placement.consumer_allocations(uuid);
      if (!held) co_return -1;
      Allocations to{{b, wanted}};  // a named local: GCC 12 cannot keep a braced temporary in co_await
      auto moved = co_await placer.begin_move(uuid, migration, *held, std::move(to));
      co_return moved ? int(*moved) : -1;
    });
  };
  auto revert = [&] {
    return step([&](Placer& placer, PlacementClient&) -> awaitable<int> {
      auto moved = co_await placer.revert_move(uuid, migration);
      co_return moved ? int(*moved) : -1;
    });
  };

  // No room on the destination: nothing changes.
  CHECK(begin({{"VCPU", 2}, {"MEMORY_MB", 4096}}) == int(Move::no_room));
  CHECK(servers.allocations(uuid) == Allocations{{a, size}});
  CHECK(servers.allocations(migration).empty());

  // Both hosts hold it while it moves; reverted, only the source does, the instance's again.
  REQUIRE(begin(size) == int(Move::moved));
  CHECK(servers.allocations(uuid) == Allocations{{b, size}});
  CHECK(servers.allocations(migration) == Allocations{{a, size}});
  CHECK(servers.usages(a)["VCPU"] == 2);
  CHECK(servers.usages(b)["VCPU"] == 2);
  CHECK(revert() == int(Move::moved));
  CHECK(servers.allocations(uuid) == Allocations{{a, size}});
  CHECK(servers.allocations(migration).empty());
  CHECK(servers.usages(b)["VCPU"] == 0);
  CHECK(revert() == int(Move::changed));  // reverted before: nothing written

  // A move that happened: the migration consumer's share goes, once, however often asked.
  REQUIRE(begin(size) == int(Move::moved));
  // While the record says so, audit sees a move in flight, not a leak, and --fix leaves it.
  // (The agents are stopped first: they would take the record up, and undo a move of an
  // instance that has no work. Their providers stay toyvm's.)
  for (Process* agent : {on_a.get(), on_b.get()}) {
    agent->signal(SIGTERM);
    agent->wait();
  }
  MoveRecord moving{.instance = uuid, .migration = migration, .source = a, .destination = b, .state = MoveState::claimed,
                    .started_at = unix_millis()};
  servers.etcd_put(KeyLayout().move(uuid), encode(moving));
  auto audited = servers.toyvm({"audit", "--json"});
  INFO(audited.out << audited.err);
  CHECK_THAT(audited.out, !Catch::Contains(migration));
  for (int twice = 0; twice < 2; ++twice) {
    CHECK(step([&](Placer& placer, PlacementClient&) -> awaitable<int> {
            co_return (co_await placer.finish_move(migration)) ? 0 : -1;
          }) == 0);
  }
  CHECK(servers.allocations(migration).empty());
  CHECK(servers.allocations(uuid) == Allocations{{b, size}});
  CHECK(servers.usages(a)["VCPU"] == 0);
}
