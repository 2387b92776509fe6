// Instances leaving their hosts: evacuations of dead hosts and moves asked by operators,
// racing each other, against a real etcd and Placement.

#include "operations.hpp"

#include "catch_result.hpp"

using namespace toyvm;
using namespace toyvm::test;

namespace {

// Host c1 with one instance on it, ACTIVE, and a second host b started after it.
struct InstanceAndSecondHost {
  std::string rp, b, uuid;
  std::unique_ptr<Process> compute, compute_b;
};

InstanceAndSecondHost instance_and_second_host(Servers& servers) {
  InstanceAndSecondHost out;
  out.compute = servers.start_compute("c1", roomy, &out.rp);
  auto placed = servers.toyvm({"schedule", small, "--wait"}, 60);
  REQUIRE(placed.exit_code == 0);
  out.uuid = parse_notified(placed.out).second;
  out.compute_b = servers.start_compute("b", roomy, &out.b);
  return out;
}

}  // namespace

TEST_CASE("two evacuations of one dead host at once move each instance once, books exact", "[operations]") {
  Servers servers;
  std::string rp, b, c;
  // c1 alone at first, so the batch lands there and can go anywhere later.
  auto compute = servers.start_compute("c1", roomy, &rp, {}, "lease_ttl = 2\n");
  auto batch = servers.toyvm({"schedule", small, "--count", "8", "--wait"}, 120);
  REQUIRE(batch.exit_code == 0);
  std::vector<std::string> uuids;
  for (const KeyValue& kv : servers.etcd_prefix(KeyLayout().work_prefix(rp)))
    uuids.push_back(kv.key.substr(KeyLayout().work_prefix(rp).size()));
  REQUIRE(uuids.size() == 8);
  auto compute_b = servers.start_compute("b", roomy, &b);
  auto compute_c = servers.start_compute("c", roomy, &c);
  compute->signal(SIGKILL);
  compute->wait(20);
  REQUIRE(wait_for([&] { return !host_record(servers, rp).has_value(); }, 30));

  auto first = servers.spawn_toyvm({"evacuate", "c1"}, "evacuate-1.log");
  auto second = servers.spawn_toyvm({"evacuate", "c1"}, "evacuate-2.log");
  first->wait(120);
  second->wait(120);
  const std::string said = first->output() + second->output();
  INFO(said);
  // Each instance is said to have moved exactly once, by one of the two.
  for (const std::string& uuid : uuids) {
    size_t moves = 0;
    for (size_t at = 0; (at = said.find("EVACUATED INSTANCE " + uuid, at)) != std::string::npos; ++at) ++moves;
    CHECK(moves == 1);
  }
  // Its work and its allocation on the same live host, nothing left on the dead one.
  for (const std::string& uuid : uuids) {
    auto record = wait_for_record(servers, uuid, [&](const InstanceRecord& r) {
      return r.host != rp && r.state == InstanceState::active;
    });
    REQUIRE(record);
    CHECK(servers.etcd_prefix(KeyLayout().work(record->host, uuid)).size() == 1);
    Allocations held = servers.allocations(uuid);
    CHECK(held.size() == 1);
    CHECK(held.count(record->host) == 1);
  }
  CHECK(servers.etcd_prefix(KeyLayout().work_prefix(rp)).empty());
  auto audit = servers.toyvm({"audit"});
  INFO(audit.out);
  CHECK(audit.exit_code == 0);
}

TEST_CASE("evacuate rebuilds a dead host's instances elsewhere, moving their allocations, and only a dead host's",
          "[operations]") {
  Servers servers;
  std::string rp, other;
  auto compute = servers.start_compute("c1", roomy, &rp, {"--trait", "CUSTOM_C1"});
  const std::string running = parse_notified(servers.toyvm({"schedule", small, "--wait"}).out).second;
  const std::string stopped = parse_notified(servers.toyvm({"schedule", small, "--wait"}).out).second;
  // Only c1 has the trait it asks for: nowhere else to go.
  const std::string pinned = parse_notified(servers.toyvm({"schedule", small + "&required=CUSTOM_C1", "--wait"}).out).second;
  REQUIRE_FALSE(pinned.empty());
  REQUIRE(servers.toyvm({"stop", stopped}).exit_code == 0);
  auto compute2 = servers.start_compute("c2", roomy, &other, {});

  auto alive = servers.toyvm({"evacuate", "c1"});
  CHECK(alive.exit_code == 5);
  CHECK_THAT(alive.err, Catch::Contains("alive"));
  CHECK(servers.allocations(running).count(rp) == 1);
  CHECK(servers.toyvm({"evacuate", "no-such-host"}).exit_code == 3);

  compute->signal(SIGKILL);
  compute->wait(20);
  REQUIRE(wait_for([&] { return !host_record(servers, rp).has_value(); }, 30));
  auto evacuated = servers.toyvm({"evacuate", "c1"});
  INFO(evacuated.out << evacuated.err);
  CHECK(evacuated.exit_code == 1);  // one found no room
  CHECK_THAT(evacuated.out, Catch::Contains(fmt::format("EVACUATED INSTANCE {} TO {}\n", running, other)) &&
                                Catch::Contains(fmt::format("EVACUATED INSTANCE {} TO {}\n", stopped, other)) &&
                                Catch::Contains(fmt::format("NO ALLOCATIONS LEFT FOR INSTANCE {}\n", pinned)));

  // Built again on c2, in the power state it had; each allocation moved whole.
  auto on_other = [&](const std::string& uuid, InstanceState state) {
    return wait_for_record(servers, uuid, [&](const InstanceRecord& r) { return r.host == other && r.state == state; });
  };
  CHECK(on_other(running, InstanceState::active));
  CHECK(on_other(stopped, InstanceState::stopped));
  for (const std::string& uuid : {running, stopped}) {
    Allocations held = servers.allocations(uuid);
    CHECK(held.size() == 1);
    CHECK(held.count(other) == 1);
    CHECK(servers.etcd_prefix(KeyLayout().work(rp, uuid)).empty());
  }
  CHECK(servers.allocations(pinned).count(rp) == 1);
  CHECK(servers.usages(rp).at("MEMORY_MB") == 64);

  // c1 comes back: what was evacuated stays where it went, what was left runs here again.
  compute = servers.start_compute("c1", roomy, &rp, {"--trait", "CUSTOM_C1"});
  CHECK(wait_for_record(servers, pinned, [&](const InstanceRecord& r) {
    return r.host == rp && r.state == InstanceState::active;
  }));
  CHECK(servers.allocations(running).count(other) == 1);
  CHECK(wait_for_record(servers, running, [&](const InstanceRecord& r) { return r.host == other; }));
  auto audit = servers.toyvm({"audit"});
  INFO(audit.out);
  CHECK(audit.exit_code == 0);
}

TEST_CASE("the harness never hands out one port twice") {
  std::set<uint16_t> ports;
  for (int i = 0; i < 2000; ++i) CHECK(ports.insert(free_port()).second);
}

TEST_CASE("destroy --force of a grouped instance whose work cannot be read leaves nothing, its membership too",
          "[operations]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:4,DISK_GB:10,MEMORY_MB:1024", &rp);
  const std::string uuid =
      parse_notified(servers.toyvm({"schedule", small, "--group", "web", "--wait"}).out).second;
  REQUIRE(!uuid.empty());
  REQUIRE(servers.etcd_prefix(KeyLayout().group_member("web", uuid)).size() == 1);
  // Its work is the only other place that names its group, and it cannot be read.
  const std::string key = KeyLayout().work(rp, uuid);
  servers.etcd_put(key, R"({"uuid":")" + uuid + R"(","group":"web","power":"paused"})");
  auto destroyed = servers.toyvm({"destroy", uuid, "--force"});
  INFO(destroyed.out << destroyed.err);
  CHECK(destroyed.exit_code == 0);
  CHECK(servers.etcd_prefix(KeyLayout().group_member("web", uuid)).empty());
  CHECK(servers.allocations(uuid).empty());
  CHECK(wait_for([&] { return servers.toyvm({"audit"}).exit_code == 0; }, 20));
}

TEST_CASE("two members of an anti-affinity group moved to one host at once: its agent lets the first come and "
          "refuses the second", "[operations]") {
  Servers servers;
  std::string rp1, rp2, rp3;
  auto c1 = servers.start_compute("c1", roomy, &rp1);
  auto c2 = servers.start_compute("c2", roomy, &rp2);
  auto placed = servers.toyvm({"schedule", small, "--count", "2", "--group", "web"}, 60);
  REQUIRE(placed.exit_code == 0);
  std::vector<std::string> members;
  std::istringstream lines(placed.out);
  for (std::string line; std::getline(lines, line);) members.push_back(parse_notified(line).second);
  REQUIRE(members.size() == 2);
  for (const std::string& uuid : members) wait_for_state(servers, uuid, "ACTIVE");
  auto c3 = servers.start_compute("c3", roomy, &rp3);
  REQUIRE(wait_for([&] { return host_record(servers, rp3) && host_record(servers, rp3)->status == "READY"; }, 30));

  // c3's agent is held still while both moves claim it: membership moves only at the switch, so
  // each claim sees the other member where it was.
  c3->signal(SIGSTOP);
  auto claimed = [&](const std::string& uuid) {
    auto kvs = servers.etcd_prefix(KeyLayout().move(uuid));
    if (kvs.empty()) return false;
    auto move = decode_move(kvs.front().value);
    return move && move->state == MoveState::claimed && move->destination == rp3;
  };
  auto first = servers.spawn_toyvm({"migrate", members[0], "--host", "c3"}, "first.log");
  REQUIRE(wait_for([&] { return claimed(members[0]); }, 20));
  auto second = servers.spawn_toyvm({"migrate", members[1], "--host", "c3"}, "second.log");
  REQUIRE(wait_for([&] { return claimed(members[1]); }, 20));
  c3->signal(SIGCONT);

  // The second, asked later, is refused by the destination before it prepares anything.
  INFO(first->output() << second->output() << c3->output());
  CHECK(second->wait(60) == 5);
  CHECK_THAT(second->output(), Catch::Contains("server group web (anti-affinity) does not allow it on host c3"));
  first->wait(60);  // the test driver moves no guest: the first is undone where libvirt moves it
  CHECK_THAT(first->output(), !Catch::Contains("server group"));
  REQUIRE(wait_for([&] { return servers.etcd_prefix(KeyLayout().moves_prefix()).empty(); }, 60));
  for (const std::string& uuid : members) CHECK(servers.allocations(uuid).count(rp3) == 0);
  auto audit = servers.toyvm({"audit"});
  INFO(audit.out);
  CHECK(audit.exit_code == 0);
}

TEST_CASE("migrate --abort undoes a move before its guest leaves: it stays, the books are back; a move that is not "
          "there cannot be aborted", "[operations]") {
  Servers servers;
  InstanceAndSecondHost setup = instance_and_second_host(servers);
  const std::string &rp = setup.rp, &b = setup.b, &uuid = setup.uuid;
  auto& compute_b = setup.compute_b;
  REQUIRE(wait_for([&] { return host_record(servers, b) && host_record(servers, b)->status == "READY"; }, 30));
  CHECK(servers.toyvm({"migrate", uuid, "--abort"}).exit_code == 3);  // not moving

  // b's agent is held still: the move stays claimed, its destination not prepared.
  compute_b->signal(SIGSTOP);
  auto migrating = servers.spawn_toyvm({"migrate", uuid, "--host", "b"}, "migrate.log");
  REQUIRE(wait_for([&] {
    auto kvs = servers.etcd_prefix(KeyLayout().move(uuid));
    auto move = kvs.empty() ? result<MoveRecord>(Error(errc::not_found)) : decode_move(kvs.front().value);
    return move && move->state == MoveState::claimed;
  }, 20));
  auto aborted = servers.toyvm({"migrate", uuid, "--abort"}, 60);
  compute_b->signal(SIGCONT);
  INFO(aborted.out << aborted.err << migrating->output());
  CHECK(aborted.exit_code == 0);
  CHECK(aborted.out == fmt::format("ABORTED MOVE OF INSTANCE {}: it stays on {} (an operator aborted it)\n", uuid, rp));
  CHECK(migrating->wait(30) == 5);
  CHECK_THAT(migrating->output(), Catch::Contains("an operator aborted it"));
  CHECK(servers.allocations(uuid) == Allocations{{rp, {{"VCPU", 1}, {"MEMORY_MB", 64}}}});
  CHECK(record_of_state(servers, uuid) == InstanceState::active);
  CHECK(wait_for([&] { return servers.toyvm({"audit"}).exit_code == 0; }, 20));
}

TEST_CASE("a destroy asked while its instance is evacuated to another host follows it there: nothing is left",
          "[operations]") {
  Servers servers;
  InstanceAndSecondHost setup = instance_and_second_host(servers);
  const std::string &rp = setup.rp, &b = setup.b, &uuid = setup.uuid;
  auto& compute = setup.compute;

  // The destroy reads the record (on c1) and waits; meanwhile c1 dies and the instance is
  // rebuilt on b.
  const std::string paused = servers.dir() + "/destroy-paused";
  auto destroying = servers.spawn_toyvm_paused("destroy.asking", paused, {"destroy", uuid}, "destroy.log");
  compute->signal(SIGKILL);
  compute->wait(20);
  REQUIRE(wait_for([&] { return !host_record(servers, rp).has_value(); }, 30));
  auto evacuated = servers.toyvm({"evacuate", "c1"}, 60);
  INFO(evacuated.out << evacuated.err);
  REQUIRE(evacuated.exit_code == 0);
  REQUIRE(wait_for_record(servers, uuid, [&](const InstanceRecord& r) { return r.host == b; }));
  fs::remove(paused);
  INFO(destroying->output());
  CHECK(destroying->wait(60) == 0);
  CHECK_THAT(destroying->output(), Catch::Contains("DESTROYED INSTANCE " + uuid));
  CHECK(servers.etcd_prefix(KeyLayout().instance(uuid)).empty());
  CHECK(servers.etcd_prefix(KeyLayout().work(b, uuid)).empty());
  CHECK(servers.allocations(uuid).empty());
  CHECK(wait_for([&] { return servers.toyvm({"audit"}).exit_code == 0; }, 20));
}

TEST_CASE("a destination gone for good after its guest left the source: the source hands it over, and evacuating "
          "the dead host rebuilds it", "[operations]") {
  Servers servers;
  InstanceAndSecondHost setup = instance_and_second_host(servers);
  std::string &rp = setup.rp, &b = setup.b;
  const std::string& uuid = setup.uuid;
  auto& compute = setup.compute;
  auto& compute_b = setup.compute_b;
  compute_b->signal(SIGKILL);
  compute_b->wait();
  REQUIRE(wait_for([&] { return !host_record(servers, b).has_value(); }, 30));

  // The source's agent restarts without its domain (its host rebooted) in the middle of a move
  // whose destination has said it prepared and then died for good: the guest left, to b or nowhere.
  compute->signal(SIGKILL);
  compute->wait();
  MoveRecord left;
  left.instance = uuid;
  left.migration = new_uuid();
  left.source = rp;
  left.destination = b;
  left.state = MoveState::left_source;
  left.started_at = unix_millis();
  servers.etcd_put(KeyLayout().move(uuid), encode(left));
  servers.move_books(uuid, left.migration, b);
  // Evacuating b now finds nothing of b's to move, and says what is still on its way to it.
  auto early = servers.toyvm({"evacuate", "b"}, 60);
  CHECK(early.exit_code == 5);
  CHECK_THAT(early.err, Catch::Contains("instance " + uuid + " was moving here from host " + rp));
  compute = servers.start_compute("c1", roomy, &rp);

  // Nobody but the destination could end that move; now the source does once b stays dead:
  // the work follows the books to b, where audit names it on a dead host, and evacuate moves it.
  REQUIRE(wait_for([&] { return servers.etcd_prefix(KeyLayout().move(uuid)).empty(); }, 60));
  CHECK(servers.etcd_prefix(KeyLayout().work(b, uuid)).size() == 1);
  CHECK(servers.allocations(left.migration).empty());
  auto audit = servers.toyvm({"audit"});
  CHECK_THAT(audit.out, Catch::Contains("work_on_dead_host"));
  auto evacuated = servers.toyvm({"evacuate", "b"}, 60);
  INFO(evacuated.out << evacuated.err << compute->output());
  CHECK(evacuated.exit_code == 0);
  CHECK(evacuated.out == fmt::format("EVACUATED INSTANCE {} TO {}\n", uuid, rp));
  wait_for_state(servers, uuid, "ACTIVE");
  CHECK(servers.allocations(uuid) == Allocations{{rp, {{"VCPU", 1}, {"MEMORY_MB", 64}}}});
  CHECK(wait_for([&] { return servers.toyvm({"audit"}).exit_code == 0; }, 20));
}

TEST_CASE("two operators moving one instance at once: one move is asked, the other is told it moves already, books "
          "exact after", "[operations]") {
  Servers servers;
  std::string rp, b;
  auto compute = servers.start_compute("c1", roomy, &rp);
  auto placed = servers.toyvm({"schedule", small, "--wait"}, 60);
  REQUIRE(placed.exit_code == 0);
  auto [target, uuid] = parse_notified(placed.out);
  REQUIRE(target == rp);
  auto compute_b = servers.start_compute("b", roomy, &b);
  REQUIRE(wait_for([&] { return host_record(servers, b) && host_record(servers, b)->status == "READY"; }, 30));

  auto migrating = servers.spawn_toyvm({"migrate", uuid, "--host", "b", "--no-wait"}, "migrate.log");
  auto resizing = servers.spawn_toyvm({"resize", uuid, "resources=VCPU:2,MEMORY_MB:64", "--no-wait"}, "resize.log");
  const int migrate_exit = migrating->wait(60), resize_exit = resizing->wait(60);
  const std::string said = migrating->output() + resizing->output();
  INFO(said);
  // Exactly one of them wrote the move; the other read it there (or the work it guards changed).
  CHECK((migrate_exit == 0) != (resize_exit == 0));
  const bool asked = said.find("MIGRATING INSTANCE " + uuid) != std::string::npos ||
                     said.find("RESIZING INSTANCE " + uuid) != std::string::npos;
  CHECK(asked);
  CHECK_THAT(said, Catch::Contains("is moving already"));

  // The test driver moves nothing: the one move is undone, and the books are as before.
  REQUIRE(wait_for([&] { return servers.etcd_prefix(KeyLayout().move(uuid)).empty(); }, 60));
  CHECK(servers.allocations(uuid) == Allocations{{rp, {{"VCPU", 1}, {"MEMORY_MB", 64}}}});
  CHECK(wait_for_record(servers, uuid, [&](const InstanceRecord& r) {
    return r.host == rp && r.state == InstanceState::active;
  }));
  auto audit = servers.toyvm({"audit"});
  INFO(audit.out);
  CHECK(audit.exit_code == 0);
}

TEST_CASE("a move with nowhere to go says NO ALLOCATIONS LEFT and leaves nothing; one whose asker died before it "
          "claimed a host is undone by the source's agent",
          "[operations]") {
  Servers servers;
  std::string rp, b;
  auto compute = servers.start_compute("c1", roomy, &rp, {}, "move_prepare_timeout = 2\n");
  auto placed = servers.toyvm({"schedule", small, "--wait"}, 60);
  REQUIRE(placed.exit_code == 0);
  auto [target, uuid] = parse_notified(placed.out);
  const Allocations before{{rp, {{"VCPU", 1}, {"MEMORY_MB", 64}}}};

  // No other host: the placer finds no room, and the move record it wrote first goes again.
  auto nowhere = servers.toyvm({"migrate", uuid});
  CHECK(nowhere.out == "NO ALLOCATIONS LEFT\n");
  CHECK(nowhere.exit_code == 1);
  CHECK(servers.etcd_prefix(KeyLayout().move(uuid)).empty());
  CHECK(servers.allocations(uuid) == before);
  // Another host, too small for a resize to go there: no room either, and nothing written.
  auto compute_b = servers.start_compute("b", "VCPU:1,MEMORY_MB:64", &b);
  REQUIRE(wait_for([&] { return host_record(servers, b) && host_record(servers, b)->status == "READY"; }, 30));
  auto too_big = servers.toyvm({"resize", uuid, "resources=VCPU:2,MEMORY_MB:64", "--host", "b"});
  CHECK(too_big.out == "NO ALLOCATIONS LEFT\n");
  CHECK(too_big.exit_code == 1);
  CHECK(servers.etcd_prefix(KeyLayout().move(uuid)).empty());
  CHECK(servers.allocations(uuid) == before);

  // A command killed after it wrote the record and moved the books, before it named the host:
  // the migration consumer holds the source's share, the instance host b's.
  MoveRecord orphan;
  orphan.instance = uuid;
  orphan.migration = new_uuid();
  orphan.source = rp;
  orphan.started_at = unix_millis();
  servers.etcd_put(KeyLayout().move(uuid), encode(orphan));
  servers.move_books(uuid, orphan.migration, b);
  REQUIRE(servers.allocations(uuid) == Allocations{{b, {{"VCPU", 1}, {"MEMORY_MB", 64}}}});
  CHECK(servers.toyvm({"audit"}).exit_code == 0);  // a move in flight, not yet a discrepancy
  REQUIRE(wait_for([&] { return servers.etcd_prefix(KeyLayout().move(uuid)).empty(); }, 30));
  CHECK(servers.allocations(uuid) == before);
  CHECK(servers.allocations(orphan.migration).empty());
  auto audit = servers.toyvm({"audit"});
  INFO(audit.out);
  CHECK(audit.exit_code == 0);
}
