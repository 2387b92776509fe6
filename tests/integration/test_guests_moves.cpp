// Real guests moved between two libvirt daemons by toyvm migrate, resize and host drain, and
// between two agents of one libvirtd.

#include "guests.hpp"

#include "catch_result.hpp"

using namespace toyvm;
using namespace toyvm::test;

TEST_CASE("toyvm migrate moves a running guest to another host and back: its count goes on, its address stays",
          "[guests]") {
  TwoHosts hosts;
  Servers& servers = hosts.host.servers;
  const std::string uuid = hosts.guest_on_first();
  const InstanceRecord before = record_of(servers, uuid);
  REQUIRE_FALSE(before.ip.empty());
  REQUIRE(wait_for([&] { return answers_ping(before.ip); }, 60));
  const int ticks = last_tick(read_file(hosts.log1(uuid)));

  auto there = servers.toyvm({"migrate", uuid}, 300);
  INFO(there.out << there.err << hosts.output());
  REQUIRE(there.exit_code == 0);
  CHECK(there.out == "MIGRATED INSTANCE " + uuid + " TO " + hosts.rp2 + "\n");
  InstanceRecord after = record_of(servers, uuid);
  CHECK(after.host == hosts.rp2);
  CHECK(after.state == InstanceState::active);
  CHECK(after.ip == before.ip);
  CHECK(after.mac == before.mac);
  CHECK(servers.etcd_prefix(KeyLayout().work(hosts.host.rp, uuid)).empty());
  CHECK(servers.etcd_prefix(KeyLayout().work(hosts.rp2, uuid)).size() == 1);
  CHECK(hosts.state2(uuid) == DomainState::running);
  CHECK(hosts.host.domain_state(uuid) == DomainState::absent);
  CHECK_FALSE(fs::exists(hosts.host.overlay(uuid)));
  hosts.expect_books_on(uuid, hosts.rp2);
  // It answers at its address over there (its filter lets it send from it at once), and counts
  // on: not booted again.
  CHECK(wait_for([&] { return answers_ping(before.ip); }, 30));
  CHECK(wait_for([&] { return last_tick(read_file(hosts.log2(uuid))) > ticks; }, 60));
  CHECK(read_file(hosts.log2(uuid)).find("toyvm-guest: booted") == std::string::npos);
  // Its old host does not build it again (the step that would runs within a second).
  CHECK_FALSE(wait_for([&] { return hosts.host.domain_state(uuid) != DomainState::absent; }, 5));

  // And back, named, to the first daemon: the second reaches it by its own path.
  const int ticks2 = last_tick(read_file(hosts.log2(uuid)));
  auto back = servers.toyvm({"migrate", uuid, "--host", "c1"}, 300);
  INFO(back.out << back.err);
  REQUIRE(back.exit_code == 0);
  CHECK(record_of(servers, uuid).host == hosts.host.rp);
  CHECK(record_of(servers, uuid).ip == before.ip);
  CHECK(hosts.host.domain_state(uuid) == DomainState::running);
  CHECK(hosts.state2(uuid) == DomainState::absent);
  hosts.expect_books_on(uuid, hosts.host.rp);
  CHECK(wait_for([&] { return answers_ping(before.ip); }, 30));
  CHECK(wait_for([&] { return last_tick(read_file(hosts.log1(uuid))) > ticks2; }, 60));

  // A move that cannot be: to its own host, of an unknown instance, of a stopped one.
  CHECK(servers.toyvm({"migrate", uuid, "--host", "c1"}).exit_code == 2);
  CHECK(servers.toyvm({"migrate", "00000000-0000-4000-8000-000000000000"}).exit_code == 3);
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
  hosts.host.expect_nothing_held(uuid);
}

TEST_CASE("a stopped guest moves cold and stays stopped; moved back cold while it runs, it boots from the disk it "
          "wrote", "[guests]") {
  TwoHosts hosts;
  Servers& servers = hosts.host.servers;
  // The guest marks its disk at its first boot, and says at each later one that it finds it.
  const std::string script = servers.dir() + "/mark-disk";
  std::ofstream(script) << "#!/bin/sh\n"
                           "if [ \"$(head -c 10 /dev/vda)\" = toyvm-mark ]; then echo 'disk kept its mark'\n"
                           "else printf toyvm-mark > /dev/vda && sync && echo 'disk marked'; fi\n";
  const std::string uuid = hosts.guests_on_first(1, {"--user-data", script}).front();
  const InstanceRecord before = record_of(servers, uuid);
  REQUIRE(wait_for([&] { return read_file(hosts.log1(uuid)).find("toyvm-guest: disk marked") != std::string::npos; },
                   60));
  REQUIRE(servers.toyvm({"stop", uuid, "--timeout", "60"}, 90).exit_code == 0);

  auto there = servers.toyvm({"migrate", uuid, "--host", "c2"}, 300);
  INFO(there.out << there.err << hosts.output());
  REQUIRE(there.exit_code == 0);
  CHECK(there.out == "MIGRATED INSTANCE " + uuid + " TO " + hosts.rp2 + " (cold)\n");
  InstanceRecord after = record_of(servers, uuid);
  CHECK(after.host == hosts.rp2);
  CHECK(after.state == InstanceState::stopped);
  CHECK(after.mac == before.mac);
  CHECK(servers.etcd_prefix(KeyLayout().work(hosts.host.rp, uuid)).empty());
  CHECK(hosts.state2(uuid) == DomainState::stopped);
  CHECK(hosts.host.domain_state(uuid) == DomainState::absent);
  CHECK_FALSE(fs::exists(hosts.host.overlay(uuid)));
  hosts.expect_books_on(uuid, hosts.rp2);
  // Left off there; started, it boots there. (Its user data is read from the metadata service
  // of the first host's agent, which serves its own guests only: it runs again on the way back.)
  CHECK_FALSE(wait_for([&] { return hosts.state2(uuid) != DomainState::stopped; }, 3));
  auto started = servers.toyvm({"start", uuid, "--timeout", "60"}, 90);
  INFO(started.err);
  REQUIRE(started.exit_code == 0);
  CHECK(wait_for([&] { return last_tick(read_file(hosts.log2(uuid))) >= 1; }, boot_timeout_s));

  // Back, cold while it runs: powered off there, its disk copied, started here again.
  auto back = servers.toyvm({"migrate", uuid, "--host", "c1", "--cold"}, 300);
  INFO(back.out << back.err);
  REQUIRE(back.exit_code == 0);
  CHECK(back.out == "MIGRATED INSTANCE " + uuid + " TO " + hosts.host.rp + " (cold)\n");
  CHECK(record_of(servers, uuid).host == hosts.host.rp);
  // MIGRATED is said once it runs there.
  CHECK(hosts.host.domain_state(uuid) == DomainState::running);
  CHECK(hosts.state2(uuid) == DomainState::absent);
  hosts.expect_books_on(uuid, hosts.host.rp);
  CHECK(wait_for([&] { return read_file(hosts.log1(uuid)).find("toyvm-guest: disk kept its mark") != std::string::npos; },
                 boot_timeout_s));
  CHECK(wait_for_record(servers, uuid, [&](const InstanceRecord& r) {
    return r.state == InstanceState::active && r.ip == before.ip;
  }, boot_timeout_s));
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
  hosts.host.expect_nothing_held(uuid);
}

TEST_CASE("toyvm resize grows a running guest on its own host, then onto another, and a stopped one in place; its "
          "disk never shrinks",
          "[guests]") {
  TwoHosts hosts;
  Servers& servers = hosts.host.servers;
  const std::string uuid = hosts.guest_on_first();
  const InstanceRecord before = record_of(servers, uuid);

  const std::string bigger = "resources=VCPU:2,MEMORY_MB:192,DISK_GB:2";
  auto here = servers.toyvm({"resize", uuid, bigger, "--host", "c1"}, 300);
  INFO(here.out << here.err << hosts.output());
  REQUIRE(here.exit_code == 0);
  CHECK(here.out == "RESIZED INSTANCE " + uuid + " ON " + hosts.host.rp + "\n");
  CHECK(servers.allocations(uuid) == Allocations{{hosts.host.rp, {{"VCPU", 2}, {"MEMORY_MB", 192}, {"DISK_GB", 2}}}});
  hosts.expect_books_on(uuid, hosts.host.rp);
  // Powered off for it, it runs again (by the time RESIZED is said) with its new size, and its
  // disk is bigger.
  REQUIRE(hosts.host.domain_state(uuid) == DomainState::running);
  auto usage = hosts.host.libvirt->usage(uuid);
  REQUIRE(usage);
  CHECK(usage->vcpus == 2);
  CHECK(usage->memory_kib == 192 * 1024);
  CHECK(usage->disk_capacity == int64_t(2) << 30);
  CHECK(wait_for([&] { return last_tick(read_file(hosts.log1(uuid))) >= 1; }, boot_timeout_s));

  // A disk never shrinks.
  auto shrink = servers.toyvm({"resize", uuid, flavor});
  CHECK(shrink.exit_code == 2);
  CHECK_THAT(shrink.err, Catch::Contains("a disk only grows"));

  // Onto the other host, bigger again: the disk copied and grown, the guest booted there.
  auto there = servers.toyvm({"resize", uuid, "resources=VCPU:1,MEMORY_MB:256,DISK_GB:3", "--host", "c2"}, 300);
  INFO(there.out << there.err);
  REQUIRE(there.exit_code == 0);
  CHECK(there.out == "RESIZED INSTANCE " + uuid + " ON " + hosts.rp2 + "\n");
  CHECK(servers.allocations(uuid) == Allocations{{hosts.rp2, {{"VCPU", 1}, {"MEMORY_MB", 256}, {"DISK_GB", 3}}}});
  hosts.expect_books_on(uuid, hosts.rp2);
  CHECK(hosts.host.domain_state(uuid) == DomainState::absent);
  REQUIRE(hosts.state2(uuid) == DomainState::running);
  auto usage2 = hosts.libvirt2->usage(uuid);
  REQUIRE(usage2);
  CHECK(usage2->memory_kib == 256 * 1024);
  CHECK(usage2->disk_capacity == int64_t(3) << 30);
  CHECK(record_of(servers, uuid).mac == before.mac);
  CHECK(wait_for([&] { return last_tick(read_file(hosts.log2(uuid))) >= 1; }, boot_timeout_s));

  // Stopped, it is resized in place and stays stopped.
  REQUIRE(servers.toyvm({"stop", uuid, "--timeout", "60"}, 90).exit_code == 0);
  auto stopped = servers.toyvm({"resize", uuid, "resources=VCPU:2,MEMORY_MB:256,DISK_GB:4", "--host", "c2"}, 300);
  INFO(stopped.out << stopped.err);
  REQUIRE(stopped.exit_code == 0);
  CHECK(servers.allocations(uuid) == Allocations{{hosts.rp2, {{"VCPU", 2}, {"MEMORY_MB", 256}, {"DISK_GB", 4}}}});
  hosts.expect_books_on(uuid, hosts.rp2);
  CHECK(record_of(servers, uuid).state == InstanceState::stopped);
  CHECK_FALSE(wait_for([&] { return hosts.state2(uuid) != DomainState::stopped; }, 3));
  auto usage3 = hosts.libvirt2->usage(uuid);
  REQUIRE(usage3);
  CHECK(usage3->vcpus == 2);
  CHECK(usage3->disk_capacity == int64_t(4) << 30);
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
  hosts.host.expect_nothing_held(uuid);
}

TEST_CASE("toyvm host drain moves a host's guests away, the running ones live and a stopped one cold, and says so",
          "[guests]") {
  TwoHosts hosts;
  Servers& servers = hosts.host.servers;
  const std::vector<std::string> uuids = hosts.guests_on_first(3);
  const std::string stopped = uuids.back();
  REQUIRE(servers.toyvm({"stop", stopped, "--timeout", "60"}, 90).exit_code == 0);
  std::map<std::string, int> ticks;
  for (const std::string& uuid : uuids) ticks[uuid] = last_tick(read_file(hosts.log1(uuid)));

  auto drained = servers.toyvm({"host", "drain", "c1", "--parallel", "2"}, 600);
  INFO(drained.out << drained.err << hosts.output());
  REQUIRE(drained.exit_code == 0);
  CHECK(drained.out.find("DRAINED HOST c1 (" + hosts.host.rp + "): 3 moved, 0 stayed") != std::string::npos);
  CHECK(drained.out.find("MOVING INSTANCE " + stopped + " TO " + hosts.rp2 + " (cold)") != std::string::npos);
  for (const std::string& uuid : uuids) {
    CHECK(drained.out.find("MOVED INSTANCE " + uuid + " TO " + hosts.rp2) != std::string::npos);
    CHECK(record_of(servers, uuid).host == hosts.rp2);
    CHECK(hosts.host.domain_state(uuid) == DomainState::absent);
    hosts.expect_books_on(uuid, hosts.rp2);
    if (uuid == stopped) {
      CHECK(hosts.state2(uuid) == DomainState::stopped);
      CHECK(record_of(servers, uuid).state == InstanceState::stopped);
      continue;
    }
    CHECK(hosts.state2(uuid) == DomainState::running);
    CHECK(wait_for([&] { return last_tick(read_file(hosts.log2(uuid))) > ticks[uuid]; }, 60));
  }
  // The drained host takes nothing new until it is enabled again.
  CHECK(host_record(servers, hosts.host.rp)->status == "DISABLED");
  for (const std::string& uuid : uuids) CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
}

TEST_CASE("moves between agents of one libvirt: refused before the guest moves, the same QEMU runs on, the books "
          "are back, audit is clean", "[guests]") {
  GuestHost host;
  Servers& servers = host.servers;
  const std::string uuid = host.schedule({"--image", "tiny"});
  REQUIRE(wait_for([&] { return last_tick(read_file(host.instances + "/" + uuid + "/console.log")) >= 1; },
                   boot_timeout_s));
  const pid_t qemu = qemu_pid(uuid);
  REQUIRE(qemu > 0);
  // A second agent on the same libvirtd, with its own state and instance dir.
  std::string other;
  auto beside = servers.start_compute("c1b", "VCPU:4,MEMORY_MB:2048,DISK_GB:20", &other,
                                      {"--libvirt-uri", "qemu:///system"},
                                      "domain_type = 'qemu'\nimage_dir = '" + host.images + "'\nnetwork = 'default'\n");
  for (const char* cold : {"", "--cold"}) {
    std::vector<std::string> argv{"migrate", uuid, "--host", "c1b"};
    if (*cold) argv.push_back(cold);
    auto moved = servers.toyvm(argv, 120);
    INFO(cold << moved.out << moved.err << host.compute->output() << "\n--- c1b ---\n" << beside->output());
    CHECK(moved.exit_code == 5);
    CHECK_THAT(moved.err, Catch::Contains("shares this host's libvirt"));
    // Nothing moved: the same QEMU process runs the guest, from the same overlay, for c1.
    CHECK(qemu_pid(uuid) == qemu);
    CHECK(host.domain_state(uuid) == DomainState::running);
    CHECK(fs::exists(host.overlay(uuid)));
    CHECK_FALSE(fs::exists(servers.dir() + "/c1b/instances/" + uuid + ".qcow2"));
    InstanceRecord record = record_of(servers, uuid);
    CHECK(record.host == host.rp);
    CHECK(record.state == InstanceState::active);
    CHECK(servers.allocations(uuid).count(host.rp) == 1);
    CHECK(servers.allocations(uuid).count(other) == 0);
    CHECK(servers.etcd_prefix(KeyLayout().moves_prefix()).empty());
  }
  // Neither agent touched the other's domain meanwhile, and the books agree with both.
  auto audit = servers.toyvm({"audit"});
  INFO(audit.out << audit.err);
  CHECK(audit.exit_code == 0);
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
  host.expect_nothing_held(uuid);
}
