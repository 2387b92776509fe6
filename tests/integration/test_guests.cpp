// Real guests: QEMU under TCG through qemu:///system, with a libvirtd these tests start.
// The guest is contrib/tiny-guest.sh's: Debian's kernel and a busybox initramfs that prints
// markers on its serial console, asks DHCP for an address, reads its metadata, and powers
// off on ACPI's power button.

#include "guests.hpp"

#include "catch_result.hpp"

using namespace toyvm;
using namespace toyvm::test;

TEST_CASE("a tiny guest boots under TCG, gets an address by DHCP and reads its own metadata", "[guests]") {
  // Nothing may assume the default network is up: the agent starts it.
  ensure_libvirtd();
  virsh({"net-destroy", "default"});
  REQUIRE_FALSE(network_active("default"));
  GuestHost host;
  CHECK(network_active("default"));

  std::string user_data = host.servers.dir() + "/user-data";
  std::ofstream(user_data) << "#cloud-config\nhostname: tiny-one\n";

  std::string uuid = host.schedule({"--image", "tiny", "--name", "tiny-one", "--user-data", user_data});
  InstanceRecord record = record_of(host.servers, uuid);
  CHECK(record.state == InstanceState::active);
  CHECK(record.ip.starts_with("192.168.122."));
  CHECK(record.mac == instance_mac(uuid));
  CHECK_THAT(host.servers.toyvm({"show", uuid}).out, Catch::Contains("ip:     " + record.ip));

  CHECK(host.console_shows(uuid, "toyvm-guest: booted"));
  CHECK(host.console_shows(uuid, "toyvm-guest: address " + record.ip));
  INFO(host.servers.toyvm({"show", uuid, "--console"}).out);
  CHECK(host.console_shows(uuid, "toyvm-guest: instance-id " + uuid, 60));
  CHECK(host.console_shows(uuid, "toyvm-guest: user-data #cloud-config", 60));

  // The overlay is copy-on-write over the 16 MiB base and as big as DISK_GB says.
  std::string head = read_file(host.overlay(uuid)).substr(0, 512);
  auto disk = probe_disk(head, fs::file_size(host.overlay(uuid)));
  CHECK_FALSE(disk);  // it has a backing file: toyvm would never accept it as an image
  REQUIRE(head.size() >= 32);
  uint64_t virtual_size = 0;
  for (int i = 24; i < 32; ++i) virtual_size = (virtual_size << 8) | uint8_t(head[i]);
  CHECK(virtual_size == uint64_t(1) << 30);
  CHECK(fs::file_size(host.overlay(uuid)) < fs::file_size(host.images + "/tiny/disk.raw"));

  CHECK(host.servers.toyvm({"destroy", uuid}).exit_code == 0);
  host.expect_nothing_left(uuid);
}

// Nova's clean-traffic, as libvirt ships it: a guest sends only from its own MAC and the
// address DHCP gave it. The guest's user data is a script that takes its neighbour's address.
TEST_CASE("a guest that takes its neighbour's address gets nothing from the metadata service", "[guests]") {
  GuestHost host;
  std::string neighbour = host.schedule({"--image", "tiny", "--name", "neighbour"});
  const std::string neighbour_ip = record_of(host.servers, neighbour).ip;
  REQUIRE(host.console_shows(neighbour, "toyvm-guest: instance-id " + neighbour, 60));

  std::string script = host.servers.dir() + "/spoof.sh";
  std::ofstream(script)
      << "#!/bin/sh\n"
         "ask() {\n"
         "  printf 'GET /latest/meta-data/instance-id HTTP/1.0\\r\\nHost: 169.254.169.254\\r\\n\\r\\n' |\n"
         "    nc -w 5 169.254.169.254 80 > /run/asked 2>/dev/null\n"
         "  echo \"$(head -1 /run/asked | tr -d '\\r') $(sed '1,/^\\r*$/d' /run/asked)\"\n"
         "}\n"
         "echo \"spoof own: $(ask)\"\n"
         "ip addr flush dev eth0\n"
         "ip addr add " << neighbour_ip << "/24 dev eth0\n"
         "ip route add 169.254.169.254/32 dev eth0\n"
         "echo \"spoof as neighbour: [$(ask)]\"\n"
         "if ping -c 3 -W 2 192.168.122.1 >/dev/null 2>&1; then echo 'spoof ping: answered'; "
         "else echo 'spoof ping: silent'; fi\n"
         "echo 'spoof done'\n";
  std::string spoofer = host.schedule({"--image", "tiny", "--name", "spoofer", "--user-data", script});
  REQUIRE(host.console_shows(spoofer, "toyvm-guest: spoof done", 90));
  std::string console = host.servers.toyvm({"show", spoofer, "--console"}).out;
  INFO(console);
  CHECK_THAT(console, Catch::Contains("toyvm-guest: spoof own: HTTP/1.0 200 OK " + spoofer));
  CHECK_THAT(console, Catch::Contains("toyvm-guest: spoof as neighbour: [ ]"));
  CHECK_THAT(console, Catch::Contains("toyvm-guest: spoof ping: silent"));
  CHECK_THAT(console, !Catch::Contains(neighbour));
  CHECK(host.servers.toyvm({"destroy", spoofer}).exit_code == 0);
  CHECK(host.servers.toyvm({"destroy", neighbour}).exit_code == 0);
}

TEST_CASE("stop, start and destroy a real guest", "[guests]") {
  GuestHost host;
  std::string uuid = host.schedule({"--image", "tiny"});
  REQUIRE(host.domain_state(uuid) == DomainState::running);
  REQUIRE(host.console_shows(uuid, "toyvm-guest: address"));

  // What it uses, from libvirt: its QEMU's memory on the host, its overlay's allocation.
  auto shown = host.servers.toyvm({"show", uuid, "--json"});
  INFO(shown.out << shown.err);
  boost::json::value usage = boost::json::parse(shown.out).at("usage");
  REQUIRE(usage.is_object());
  CHECK(usage.at("running").as_bool());
  CHECK(usage.at("memory_mb").as_int64() == 128);
  CHECK(usage.at("rss_mb").as_int64() > 0);
  CHECK(usage.at("cpu_time_s").as_double() > 0);
  CHECK_FALSE(usage.as_object().contains("simulated"));  // measured
  CHECK(usage.at("disk_capacity").as_int64() >= int64_t(1) << 30);  // DISK_GB:1
  CHECK(usage.at("disk_allocation").as_int64() >= 0);
  CHECK_THAT(host.servers.toyvm({"show", uuid}).out, Catch::Contains("held on the host") && Catch::Contains("(its overlay)"));

  auto stopped = host.servers.toyvm({"stop", uuid, "--timeout", "60"}, 90);
  INFO(stopped.err);
  CHECK(stopped.exit_code == 0);
  CHECK(host.domain_state(uuid) == DomainState::stopped);
  CHECK_THAT(host.servers.toyvm({"show", uuid}).out, Catch::Contains("STOPPED"));
  CHECK(host.console_shows(uuid, "toyvm-guest: power button", 30));  // asked, not forced
  CHECK(fs::exists(host.overlay(uuid)));                              // the disk stays
  CHECK(host.servers.usages(host.rp)["VCPU"] == 1);

  auto started = host.servers.toyvm({"start", uuid, "--timeout", "60"}, 90);
  CHECK(started.exit_code == 0);
  CHECK(host.domain_state(uuid) == DomainState::running);
  auto with_ip = wait_for_record(host.servers, uuid, [](const InstanceRecord& r) {
    return r.state == InstanceState::active && !r.ip.empty();
  }, boot_timeout_s);
  CHECK(with_ip);

  CHECK(host.servers.toyvm({"destroy", uuid}).exit_code == 0);
  host.expect_nothing_left(uuid);
  CHECK(host.servers.usages(host.rp)["VCPU"] == 0);
}

TEST_CASE("an evacuated guest is rebuilt elsewhere, and removed by its old host's agent when it comes back",
          "[guests]") {
  GuestHost host;
  std::string uuid = host.schedule({"--image", "tiny"});
  REQUIRE(host.domain_state(uuid) == DomainState::running);
  // The other host is on the test driver, with the same images.
  std::string other;
  auto compute2 = host.servers.start_compute("c2", "VCPU:4,MEMORY_MB:2048,DISK_GB:20", &other, {},
                                             "image_dir = '" + host.images + "'\n");
  host.compute->signal(SIGKILL);
  host.compute->wait(20);
  REQUIRE(wait_for([&] { return !host_record(host.servers, host.rp).has_value(); }, 30));
  auto evacuated = host.servers.toyvm({"evacuate", "c1"});
  INFO(evacuated.out << evacuated.err);
  CHECK(evacuated.exit_code == 0);
  CHECK(evacuated.out == "EVACUATED INSTANCE " + uuid + " TO " + other + "\n");
  CHECK(wait_for_record(host.servers, uuid, [&](const InstanceRecord& r) {
    return r.host == other && r.state == InstanceState::active;
  }));
  // The dead host's guest was never seen to stop (the host is cut off, not powered off here).
  CHECK(host.domain_state(uuid) == DomainState::running);

  host.start_agent();
  // The domain goes first, then its disk.
  CHECK(wait_for([&] { return host.domain_state(uuid) == DomainState::absent; }, 60));
  CHECK(wait_for([&] { return !fs::exists(host.overlay(uuid)); }, 30));
  Allocations held = host.servers.allocations(uuid);
  CHECK(held.size() == 1);
  CHECK(held.count(other) == 1);
  InstanceRecord record = record_of(host.servers, uuid);
  CHECK(record.host == other);
  CHECK(record.state == InstanceState::active);
  CHECK(host.servers.usages(host.rp)["VCPU"] == 0);
}

TEST_CASE("a guest that powers itself off stays STOPPED; one whose QEMU dies is started again", "[guests]") {
  GuestHost host;  // on_guest_crash = "restart", resync every 60 s
  std::string uuid = host.schedule({"--image", "tiny"});
  REQUIRE(host.console_shows(uuid, "toyvm-guest: address"));

  // The power button pressed outside toyvm: the guest powers itself off. libvirt's event says
  // so at once; the resync would take up to a minute.
  REQUIRE(virsh({"shutdown", domain_name(uuid)}).exit_code == 0);
  REQUIRE(wait_for([&] { return host.domain_state(uuid) == DomainState::stopped; }, 60));
  auto stopped = wait_for_record(host.servers, uuid, [](const InstanceRecord& r) {
    return r.state == InstanceState::stopped;
  }, 15);
  CHECK(stopped);
  CHECK(work_power_is(host, uuid, PowerState::stopped));  // its desired power followed
  CHECK(host.domain_state(uuid) == DomainState::stopped);
  CHECK(host.servers.usages(host.rp)["VCPU"] == 1);       // it keeps its resources

  auto started = host.servers.toyvm({"start", uuid, "--timeout", "60"}, 90);
  CHECK(started.exit_code == 0);
  REQUIRE(host.domain_state(uuid) == DomainState::running);

  // QEMU killed: libvirt calls it a crash; the default policy starts the guest again.
  pid_t first = qemu_pid(uuid);
  REQUIRE(first > 0);
  REQUIRE(::kill(first, SIGKILL) == 0);
  // Started again: a new QEMU, through with starting up (not paused in its start any more).
  CHECK(wait_for([&] {
    pid_t now = qemu_pid(uuid);
    return now > 0 && now != first && virsh({"domstate", "--reason", domain_name(uuid)}).out == "running (booted)\n";
  }, 15));
  CHECK(record_of(host.servers, uuid).state == InstanceState::active);
  CHECK(work_power_is(host, uuid, PowerState::running));

  // Killed outside toyvm with virsh destroy: STOPPED, as a guest that powered off.
  REQUIRE(virsh({"destroy", domain_name(uuid)}).exit_code == 0);
  CHECK(wait_for_record(host.servers, uuid, [](const InstanceRecord& r) { return r.state == InstanceState::stopped; }, 15));
  CHECK(work_power_is(host, uuid, PowerState::stopped));
  CHECK(host.servers.toyvm({"destroy", uuid}).exit_code == 0);
  host.expect_nothing_left(uuid);
}

TEST_CASE("a guest paused for a reason libvirt does not know runs on; one a user paused stays paused", "[guests]") {
  GuestHost host;
  std::string uuid = host.schedule({"--image", "tiny"});
  REQUIRE(host.console_shows(uuid, "toyvm-guest: address"));
  const pid_t qemu = qemu_pid(uuid);
  auto state = [&] { return virsh({"domstate", "--reason", domain_name(uuid)}).out; };
  // QEMU stopped behind libvirt's back, as the end of a migration stops it: libvirt does not
  // know why, and resumes such a guest itself only as it recovers a migration. Its agent does.
  REQUIRE(virsh({"qemu-monitor-command", domain_name(uuid), "--hmp", "stop"}).exit_code == 0);
  CHECK(wait_for([&] { return state() == "running (unpaused)\n"; }, 30));  // resumed, not booted again
  CHECK(qemu_pid(uuid) == qemu);
  CHECK(record_of(host.servers, uuid).state == InstanceState::active);
  // Paused by a user (virsh suspend): theirs to resume.
  REQUIRE(virsh({"suspend", domain_name(uuid)}).exit_code == 0);
  CHECK_FALSE(wait_for([&] { return state() != "paused (user)\n"; }, 5));
  REQUIRE(virsh({"resume", domain_name(uuid)}).exit_code == 0);
  CHECK(host.servers.toyvm({"destroy", uuid}).exit_code == 0);
  host.expect_nothing_left(uuid);
}

TEST_CASE("with on_guest_crash = \"error\" a guest whose QEMU dies is ERROR launch_failure and holds nothing", "[guests]") {
  GuestHost host("on_guest_crash = 'error'\n");
  std::string uuid = host.schedule({"--image", "tiny"});
  pid_t qemu = qemu_pid(uuid);
  REQUIRE(qemu > 0);
  REQUIRE(::kill(qemu, SIGKILL) == 0);
  auto failed = wait_for_record(host.servers, uuid, [](const InstanceRecord& r) {
    return r.state == InstanceState::error && !r.releasing;
  }, 15);
  REQUIRE(failed);
  CHECK(failed->error_code == "launch_failure");
  CHECK(wait_for([&] { return host.domain_state(uuid) == DomainState::absent; }, 15));
  host.expect_nothing_held(uuid);
  CHECK(host.servers.toyvm({"destroy", uuid}).exit_code == 0);
}

TEST_CASE("destroy while building leaves nothing in libvirt, on disk or in Placement", "[guests]") {
  GuestHost host;
  StallingServer stalling(host.servers.dir() + "/stall.log");
  auto scheduled = host.servers.toyvm({"schedule", flavor, "--image", stalling.url()});
  REQUIRE(scheduled.exit_code == 0);
  auto [target, uuid] = parse_notified(scheduled.out);
  REQUIRE(wait_for_record(host.servers, uuid, [](const InstanceRecord& r) { return r.state == InstanceState::building; }));

  CHECK(host.servers.toyvm({"destroy", uuid, "--timeout", "30"}).exit_code == 0);
  host.expect_nothing_left(uuid);
  CHECK(host.servers.usages(host.rp)["VCPU"] == 0);
}

TEST_CASE("missing and corrupt images are ERROR image_failure with the allocation released", "[guests]") {
  GuestHost host;
  std::ofstream(host.images + "/corrupt.qcow2", std::ios::binary) << std::string("QFI\xfb\0\0\0\x03", 8) << "short";
  for (const char* image : {"missing", "corrupt.qcow2"}) {
    std::string uuid = host.schedule({"--image", image}, 5);
    InstanceRecord record = record_of(host.servers, uuid);
    CHECK(record.state == InstanceState::error);
    CHECK(record.error_code == "image_failure");
    host.expect_nothing_held(uuid);
    CHECK(host.servers.toyvm({"destroy", uuid}).exit_code == 0);
    host.expect_nothing_left(uuid);
  }
  CHECK(host.servers.usages(host.rp)["VCPU"] == 0);
}

TEST_CASE("libvirt's own words reach toyvm show: a network that cannot start, a domain it refuses", "[guests]") {
  ensure_libvirtd();
  Servers servers;
  // A NAT network on the default network's subnet: libvirt will not start it beside virbr0.
  std::string clash = servers.dir() + "/clash.xml";
  std::ofstream(clash) << "<network><name>toyvm-test-clash</name><forward mode='nat'/>"
                          "<ip address='192.168.122.1' netmask='255.255.255.0'/></network>";
  virsh({"net-undefine", "toyvm-test-clash"});
  REQUIRE(virsh({"net-define", clash}).exit_code == 0);
  virsh({"net-start", "default"});
  REQUIRE(network_active("default"));

  std::string clashing, plain;
  auto on_clash = servers.start_compute("clash", "VCPU:4,MEMORY_MB:2048,DISK_GB:10", &clashing,
                                        {"--libvirt-uri", "qemu:///system", "--trait", "CUSTOM_CLASH"},
                                        "domain_type = 'qemu'\nnetwork = 'toyvm-test-clash'\n");
  auto on_plain = servers.start_compute("plain", "VCPU:512,MEMORY_MB:2048,DISK_GB:10", &plain,
                                        {"--libvirt-uri", "qemu:///system", "--trait", "CUSTOM_PLAIN"},
                                        "domain_type = 'qemu'\nnetwork = ''\n");
  struct Case {
    std::string query, host, libvirt_says;
  };
  for (const Case& c : {Case{"resources=VCPU:1,MEMORY_MB:128,DISK_GB:1&required=CUSTOM_CLASH", clashing,
                             "Network is already in use by interface virbr0"},
                        Case{"resources=VCPU:300,MEMORY_MB:128,DISK_GB:1&required=CUSTOM_PLAIN", plain,
                             "Maximum CPUs greater than specified machine type limit"}}) {
    auto scheduled = servers.toyvm({"schedule", c.query, "--wait", "--timeout", "60"}, 90);
    INFO(scheduled.out << scheduled.err << on_clash->output() << on_plain->output());
    CHECK(scheduled.exit_code == 5);
    auto [target, uuid] = parse_notified(scheduled.out);
    REQUIRE(target == c.host);
    auto shown = servers.toyvm({"show", uuid});
    CHECK_THAT(shown.out, Catch::Contains("ERROR") && Catch::Contains(c.libvirt_says));
    CHECK_THAT(shown.out, !Catch::Contains("unknown libvirt error"));
    CHECK(servers.allocations(uuid).empty());
    CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
  }
  CHECK_THAT(on_clash->output(), Catch::Contains("Network is already in use by interface virbr0"));
  virsh({"net-undefine", "toyvm-test-clash"});
}

TEST_CASE("schedule --wait stops at the host's address_timeout for a guest that never asks DHCP", "[guests]") {
  ensure_libvirtd();
  Servers servers;
  std::string images = servers.dir() + "/images";
  fs::create_directories(images + "/tiny");
  for (const char* file : {"kernel", "initrd", "cmdline"})
    fs::copy_file(tiny_guest_dir() + "/" + file, images + "/tiny/" + file);
  // rtl8139: a NIC the tiny guest has no driver for, so it never asks for an address.
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:2,MEMORY_MB:1024,DISK_GB:10", &rp,
                                       {"--libvirt-uri", "qemu:///system"},
                                       "domain_type = 'qemu'\nimage_dir = '" + images +
                                           "'\nnic_model = 'rtl8139'\naddress_timeout = 5\n");
  auto scheduled = servers.toyvm({"schedule", flavor, "--image", "tiny", "--wait", "--timeout", "120"}, 150);
  INFO(scheduled.out << scheduled.err << compute->output());
  CHECK(scheduled.exit_code == 6);
  CHECK_THAT(scheduled.out, Catch::Contains("ACTIVE"));
  CHECK_THAT(scheduled.err, Catch::Contains("ACTIVE") && Catch::Contains("no address"));
  CHECK(count_lines(scheduled.err) == 1);
  auto [target, uuid] = parse_notified(scheduled.out);
  REQUIRE(!uuid.empty());
  InstanceRecord record = record_of(servers, uuid);
  CHECK(record.state == InstanceState::active);
  CHECK(record.no_address);
  CHECK_THAT(servers.toyvm({"show", uuid}).out, Catch::Contains("address_timeout"));
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
}
