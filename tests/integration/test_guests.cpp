// Real guests: QEMU under TCG through qemu:///system, with a libvirtd these tests start.
// The guest is contrib/tiny-guest.sh's: Debian's kernel and a busybox initramfs that prints
// markers on its serial console, asks DHCP for an address, reads its metadata, and powers
// off on ACPI's power button.

#include "harness.hpp"
#include "model/image.hpp"
#include "model/keys.hpp"
#include "model/moves.hpp"
#include "model/records.hpp"
#include "virt/backend.hpp"
#include "virt/images.hpp"

#include "catch_result.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/json/parse.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace toyvm;
using namespace toyvm::test;
namespace fs = std::filesystem;

namespace {

const std::string flavor = "resources=VCPU:1,MEMORY_MB:128,DISK_GB:1";
constexpr double boot_timeout_s = 180;  // TCG on a loaded 2-core machine

struct GuestHost {
  Servers servers;
  std::string rp;
  std::string images;
  std::string instances;
  std::unique_ptr<Process> compute;
  std::unique_ptr<VirtBackend> libvirt;  // the tests' own view of qemu:///system
  std::string compute_toml;

  // `compute_toml`: more of the agent's [compute] settings.
  explicit GuestHost(const std::string& compute_toml = "") : compute_toml(compute_toml) {
    ensure_libvirtd();
    images = servers.dir() + "/images";
    instances = servers.dir() + "/c1/instances";
    fs::create_directories(images + "/tiny");
    for (const char* file : {"kernel", "initrd", "cmdline", "disk.raw"})
      fs::copy_file(tiny_guest_dir() + "/" + file, images + "/tiny/" + file);
    start_agent();
    LibvirtOptions system;
    system.uri = "qemu:///system";
    system.network = "default";
    auto opened = open_libvirt(system);
    if (!opened) throw std::runtime_error(opened.error().message());
    libvirt = std::move(*opened);
  }

  // The agent of c1 on qemu:///system (again, after it was stopped).
  void start_agent() {
    compute = servers.start_compute("c1", "VCPU:4,MEMORY_MB:2048,DISK_GB:20", &rp,
                                    {"--libvirt-uri", "qemu:///system"},
                                    "domain_type = 'qemu'\n"
                                    "image_dir = '" + images + "'\n"
                                    "network = 'default'\n"
                                    "stop_timeout = 20\n"
                                    "console_interval = 0.5\n" + compute_toml +
                                    // The agent serves its guests' metadata on their bridge.
                                    "metadata_interface = 'virbr0'\n"
                                    "[mdserver]\nlisten = ['169.254.169.254:80']\n");
  }

  std::string schedule(std::vector<std::string> args, int expected_exit = 0) {
    std::vector<std::string> argv{"schedule", flavor, "--wait", "--timeout", std::to_string(int(boot_timeout_s))};
    argv.insert(argv.end(), args.begin(), args.end());
    auto scheduled = servers.toyvm(argv, boot_timeout_s + 30);
    INFO(scheduled.out << scheduled.err << compute->output());
    CHECK(scheduled.exit_code == expected_exit);
    auto [target, uuid] = parse_notified(scheduled.out);
    REQUIRE(!uuid.empty());
    return uuid;
  }

  bool console_shows(const std::string& uuid, const std::string& text, double timeout_s = boot_timeout_s) {
    return wait_for([&] { return servers.toyvm({"show", uuid, "--console"}).out.find(text) != std::string::npos; },
                    timeout_s);
  }

  DomainState domain_state(const std::string& uuid) {
    auto state = libvirt->state(uuid);
    return state ? *state : DomainState::absent;
  }

  std::string overlay(const std::string& uuid) const { return instances + "/" + uuid + ".qcow2"; }

  // Nothing of the instance in libvirt, on disk or in Placement.
  void expect_nothing_held(const std::string& uuid) {
    CHECK(domain_state(uuid) == DomainState::absent);
    CHECK_FALSE(fs::exists(overlay(uuid)));
    CHECK_FALSE(fs::exists(instances + "/" + uuid));
    CHECK(servers.allocations(uuid).empty());
  }

  // ... and nothing in etcd either.
  void expect_nothing_left(const std::string& uuid) {
    expect_nothing_held(uuid);
    CHECK(servers.etcd_prefix(KeyLayout().work(rp, uuid)).empty());
    CHECK(servers.etcd_prefix(KeyLayout().instance(uuid)).empty());
  }
};

// virsh, for what toyvm's backend has no call for.
CommandResult virsh(std::vector<std::string> args) {
  TempDir dir;
  args.insert(args.begin(), {"virsh", "-q", "-c", "qemu:///system"});
  return run_command(args, dir.path());
}

bool network_active(const std::string& network) {
  return virsh({"net-info", network}).out.find("Active:         yes") != std::string::npos;
}

InstanceRecord record_of(const Servers& servers, const std::string& uuid) {
  auto kvs = servers.etcd_prefix(KeyLayout().instance(uuid));
  REQUIRE(kvs.size() == 1);
  auto record = decode_instance(kvs.front().value);
  REQUIRE(record);
  return *record;
}

}  // namespace

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

// The pid of the instance's QEMU, as libvirt wrote it down.
pid_t qemu_pid(const std::string& uuid) {
  std::string text = read_file("/run/libvirt/qemu/" + domain_name(uuid) + ".pid");
  return text.empty() ? 0 : pid_t(std::stol(text));
}

bool work_power_is(const GuestHost& host, const std::string& uuid, PowerState power) {
  auto kvs = host.servers.etcd_prefix(KeyLayout().work(host.rp, uuid));
  if (kvs.size() != 1) return false;
  auto spec = decode_work(kvs.front().value);
  return spec && spec->power == power;
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

TEST_CASE("agents sharing one libvirt never touch each other's domains", "[guests]") {
  ensure_libvirtd();
  Servers servers;
  const std::string no_guest = "domain_type = 'qemu'\nnetwork = ''\nresync_interval = 0.2\n";
  std::string first, second;
  auto a = servers.start_compute("a", "VCPU:2,MEMORY_MB:1024,DISK_GB:10", &first,
                                 {"--libvirt-uri", "qemu:///system", "--trait", "CUSTOM_A"}, no_guest);
  auto on_a = servers.toyvm({"schedule", "resources=VCPU:1,MEMORY_MB:64,DISK_GB:1&required=CUSTOM_A", "--wait"}, 120);
  REQUIRE(on_a.exit_code == 0);
  std::string a_uuid = parse_notified(on_a.out).second;

  // A second agent on the same libvirt, as on a host whose state dir was lost: the first
  // agent's domain is not its work, and it must leave it alone.
  auto b = servers.start_compute("b", "VCPU:2,MEMORY_MB:1024,DISK_GB:10", &second,
                                 {"--libvirt-uri", "qemu:///system", "--trait", "CUSTOM_B"}, no_guest);
  auto on_b = servers.toyvm({"schedule", "resources=VCPU:1,MEMORY_MB:64,DISK_GB:1&required=CUSTOM_B", "--wait"}, 120);
  REQUIRE(on_b.exit_code == 0);
  std::string b_uuid = parse_notified(on_b.out).second;

  LibvirtOptions system;
  system.uri = "qemu:///system";
  auto libvirt = open_libvirt(system);
  REQUIRE(libvirt);
  INFO(b->output());
  // Several resyncs of the second agent: the first one's domain keeps running.
  CHECK_FALSE(wait_for([&] {
    auto state = (*libvirt)->state(a_uuid);
    return !state || *state != DomainState::running;
  }, 3));
  CHECK((*libvirt)->state(b_uuid).value() == DomainState::running);
  CHECK(record_of(servers, a_uuid).state == InstanceState::active);
  CHECK(servers.toyvm({"destroy", a_uuid}).exit_code == 0);
  CHECK(servers.toyvm({"destroy", b_uuid}).exit_code == 0);
  CHECK((*libvirt)->state(a_uuid).value() == DomainState::absent);
  CHECK((*libvirt)->state(b_uuid).value() == DomainState::absent);
}

// Two hosts on one machine: each agent with its own libvirt network and bridge, and its own
// metadata service on 169.254.169.254 there. Each guest reads its own data from its own host.
TEST_CASE("two agents with their own networks each serve their own guest's metadata", "[guests]") {
  ensure_libvirtd();
  Servers servers;
  const std::string network_b = "toyvm-test-b";
  std::string network_xml = servers.dir() + "/network-b.xml";
  std::ofstream(network_xml) << "<network><name>" << network_b << "</name><forward mode='nat'/>"
                             << "<bridge name='toyvm-b0' stp='off'/>"
                             << "<ip address='192.168.123.1' netmask='255.255.255.0'><dhcp>"
                             << "<range start='192.168.123.2' end='192.168.123.254'/></dhcp></ip></network>";
  virsh({"net-destroy", network_b});  // left over from an interrupted run
  REQUIRE(virsh({"net-create", network_xml}).exit_code == 0);
  struct Cleanup {
    std::string network;
    ~Cleanup() { virsh({"net-destroy", network}); }
  } cleanup{network_b};

  std::string images = servers.dir() + "/images";
  fs::create_directories(images + "/tiny");
  for (const char* file : {"kernel", "initrd", "cmdline", "disk.raw"})
    fs::copy_file(tiny_guest_dir() + "/" + file, images + "/tiny/" + file);
  struct Host {
    std::string name, trait, network, bridge, provider, uuid;
    std::unique_ptr<Process> agent;
  };
  std::vector<Host> hosts(2);
  hosts[0].name = "a", hosts[0].trait = "CUSTOM_HOST_A", hosts[0].network = "default", hosts[0].bridge = "virbr0";
  hosts[1].name = "b", hosts[1].trait = "CUSTOM_HOST_B", hosts[1].network = network_b, hosts[1].bridge = "toyvm-b0";
  for (Host& host : hosts) {
    host.agent = servers.start_compute(host.name, "VCPU:2,MEMORY_MB:1024,DISK_GB:10", &host.provider,
                                       {"--libvirt-uri", "qemu:///system", "--trait", host.trait},
                                       "domain_type = 'qemu'\nimage_dir = '" + images + "'\nnetwork = '" +
                                           host.network + "'\nmetadata_interface = '" + host.bridge +
                                           "'\n[mdserver]\nlisten = ['169.254.169.254:80']\n");
  }
  // Both guests boot at once.
  std::vector<std::unique_ptr<Process>> schedules;
  for (Host& host : hosts)
    schedules.push_back(servers.spawn_toyvm({"schedule", flavor + "&required=" + host.trait, "--image",
                                             "tiny", "--name", "guest-" + host.name, "--wait", "--timeout",
                                             std::to_string(int(boot_timeout_s))},
                                            "schedule-" + host.name + ".log"));
  for (size_t i = 0; i < hosts.size(); ++i) {
    INFO(schedules[i]->output() << hosts[i].agent->output());
    REQUIRE(schedules[i]->wait(boot_timeout_s + 30) == 0);
    hosts[i].uuid = parse_notified(schedules[i]->output()).second;
    CHECK_THAT(hosts[i].agent->output(), Catch::Contains("serving metadata on 169.254.169.254:80 (" + hosts[i].bridge + ")"));
  }
  CHECK(record_of(servers, hosts[1].uuid).ip.starts_with("192.168.123."));
  for (Host& host : hosts) {
    bool served = wait_for([&] {
      return servers.toyvm({"show", host.uuid, "--console"}).out.find("toyvm-guest: instance-id " + host.uuid) !=
             std::string::npos;
    }, 90);
    INFO(servers.toyvm({"show", host.uuid, "--console"}).out << host.agent->output());
    CHECK(served);
    CHECK(servers.toyvm({"destroy", host.uuid}).exit_code == 0);
  }
}

TEST_CASE("after a libvirtd restart the agent connects again and builds here, with no attempt burnt", "[guests]") {
  ensure_libvirtd();
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", "VCPU:2,MEMORY_MB:1024,DISK_GB:10", &rp,
                                       {"--libvirt-uri", "qemu:///system"}, "domain_type = 'qemu'\nnetwork = ''\n");
  REQUIRE(std::system("pkill -x libvirtd") == 0);
  REQUIRE(wait_for([] { return std::system("pgrep -x libvirtd >/dev/null") != 0; }, 30));
  REQUIRE(std::system(TOYVM_SOURCE_ROOT "/contrib/start-libvirtd.sh 2>/dev/null") == 0);

  auto scheduled = servers.toyvm({"schedule", "resources=VCPU:1,MEMORY_MB:64,DISK_GB:1", "--wait", "--timeout", "60"}, 90);
  INFO(scheduled.out << scheduled.err << compute->output());
  CHECK(scheduled.exit_code == 0);
  auto [target, uuid] = parse_notified(scheduled.out);
  REQUIRE(target == rp);
  CHECK(record_of(servers, uuid).state == InstanceState::active);
  CHECK_THAT(compute->output(), Catch::Contains("connected again"));
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
}

TEST_CASE("libvirtd keeps its QEMU capabilities between calls on the host the scripts set up", "[guests]") {
  // libvirtd rewrites its cache file whenever it probes QEMU again; a host where it takes every
  // probe for outdated (see contrib/start-libvirtd.sh) pays a probe on each define and start.
  ensure_libvirtd();
  REQUIRE(virsh({"domcapabilities"}).exit_code == 0);
  const fs::path cache = "/var/cache/libvirt/qemu/capabilities";
  auto written = [&] {
    std::map<std::string, fs::file_time_type> times;
    for (const auto& entry : fs::directory_iterator(cache)) times[entry.path()] = entry.last_write_time();
    return times;
  };
  auto before = written();
  REQUIRE_FALSE(before.empty());
  for (int i = 0; i < 3; ++i) REQUIRE(virsh({"domcapabilities"}).exit_code == 0);
  CHECK(written() == before);
}

TEST_CASE("a second libvirtd is a second host: its agent boots a guest there, on the first one's network",
          "[guests]") {
  GuestHost host;
  const std::string second_uri = ensure_second_libvirtd();
  std::string rp2;
  const std::string instances2 = host.servers.dir() + "/c2/instances";
  auto second = host.servers.start_compute("c2", "VCPU:4,MEMORY_MB:2048,DISK_GB:20", &rp2,
                                           {"--libvirt-uri", second_uri},
                                           "domain_type = 'qemu'\n"
                                           "image_dir = '" + host.images + "'\n"
                                           "network = 'default'\n"
                                           "stop_timeout = 20\n"
                                           "console_interval = 0.5\n");
  REQUIRE(host.servers.toyvm({"host", "disable", "c1"}).exit_code == 0);
  std::string uuid = host.schedule({"--image", "tiny"});
  INFO(second->output());
  InstanceRecord record = record_of(host.servers, uuid);
  CHECK(record.host == rp2);
  CHECK_FALSE(record.ip.empty());  // by DHCP from the first daemon's network, bridged
  CHECK(host.console_shows(uuid, "toyvm-guest"));

  LibvirtOptions options;
  options.uri = second_uri;
  auto libvirt2 = open_libvirt(options);
  REQUIRE(libvirt2);
  CHECK((*libvirt2)->state(uuid).value() == DomainState::running);
  CHECK(host.domain_state(uuid) == DomainState::absent);  // not on the first daemon
  CHECK(fs::exists(instances2 + "/" + uuid + ".qcow2"));

  CHECK(host.servers.toyvm({"destroy", uuid}).exit_code == 0);
  CHECK((*libvirt2)->state(uuid).value() == DomainState::absent);
  CHECK(host.servers.allocations(uuid).empty());
}

namespace {
// The number of the last heartbeat ("toyvm-guest: tick N uptime U") in a console log; 0: none.
int last_tick(const std::string& log) {
  const std::string mark = "toyvm-guest: tick ";
  const size_t at = log.rfind(mark);
  return at == std::string::npos ? 0 : std::atoi(log.c_str() + at + mark.size());
}
}  // namespace

TEST_CASE("a running guest moves live to the second libvirtd: its disk comes along, its count goes on",
          "[guests]") {
  GuestHost host;
  const std::string second_uri = ensure_second_libvirtd();
  const std::string uuid = host.schedule({"--image", "tiny"});
  const InstanceRecord record = record_of(host.servers, uuid);
  const std::string log1 = host.instances + "/" + uuid + "/console.log";
  REQUIRE(wait_for([&] { return last_tick(read_file(log1)) >= 2; }, boot_timeout_s));
  // The agent takes a guest that leaves for one it lost and would build it again: it is
  // stopped (its guests keep running) while its backend's move is checked on its own.
  host.compute->signal(SIGTERM);
  host.compute->wait();

  const std::string instances2 = host.servers.dir() + "/c2/instances";
  fs::create_directories(instances2);
  LibvirtOptions to;
  to.uri = second_uri;
  to.domain_type = "qemu";
  to.instance_dir = instances2;
  to.network = "default";
  to.owner = "22222222-0000-4000-8000-000000000002";
  auto destination = open_libvirt(to);
  REQUIRE(destination);
  // The guest as its new host would describe it: the same image, size, MAC; its address known.
  asio::io_context io;
  asio::thread_pool pool(1);
  ImageStoreOptions image_options;
  image_options.image_dir = host.images;
  ImageRef tiny_ref;
  tiny_ref.name = "tiny";
  auto image = ImageStore(io.get_executor(), pool, image_options)
                   .resolve_local(tiny_ref, "", std::nullopt);
  REQUIRE(image);
  DomainSpec spec;
  spec.uuid = uuid;
  spec.name = uuid;
  spec.vcpus = 1;
  spec.memory_mb = 128;
  spec.disk_gb = 1;
  spec.image = *image;
  spec.mac = instance_mac(uuid);
  spec.ip = record.ip;
  auto xml = (*destination)->prepare_incoming(spec);
  REQUIRE(xml);

  // The source's backend as its agent has it: its instance dir, its provider as the owner.
  LibvirtOptions from;
  from.uri = "qemu:///system";
  from.domain_type = "qemu";
  from.instance_dir = host.instances;
  from.network = "default";
  from.owner = host.rp;
  auto source = open_libvirt(from);
  REQUIRE(source);
  const int before = last_tick(read_file(log1));
  auto moved = (*source)->migrate(uuid, MigrationTarget{second_uri, "tcp://127.0.0.1", *xml});
  INFO(said(moved));
  REQUIRE(moved);
  CHECK(moved->bytes > 0);          // its memory and its disk went over
  CHECK(moved->downtime_ms >= 0);  // QEMU's own figure reached the destination
  CHECK((*destination)->state(uuid).value() == DomainState::running);
  CHECK(host.domain_state(uuid) == DomainState::absent);
  CHECK_FALSE(fs::exists(host.overlay(uuid)));  // the source's files are gone
  // Only the overlay's own blocks went: the destination's overlay does not hold the whole disk.
  CHECK(fs::file_size(instances2 + "/" + uuid + ".qcow2") < (uint64_t(64) << 20));
  // Its console goes on in the destination's log, counting on: it was not booted again.
  const std::string log2 = instances2 + "/" + uuid + "/console.log";
  CHECK(wait_for([&] { return last_tick(read_file(log2)) > before; }, 60));
  CHECK(read_file(log2).find("toyvm-guest: booted") == std::string::npos);
  CHECK((*destination)->destroy(uuid));
}

namespace {
// Two agents, each on its own libvirtd, that take guests moving in: c1 on the first daemon
// (GuestHost's), c2 on the second.
struct TwoHosts {
  GuestHost host;
  std::string rp2;
  std::string instances2 = host.servers.dir() + "/c2/instances";
  std::string second_toml;
  std::string second_move_uri;  // how c2 says it is reached; empty: its daemon's URI
  std::unique_ptr<Process> second;
  std::unique_ptr<VirtBackend> libvirt2;

  // More [compute] settings for c1 and c2.
  explicit TwoHosts(const std::string& first_toml = "", const std::string& second_toml = "")
      : host("move_libvirt_uri = '" + first_libvirtd_from_second() + "'\nmove_address = '127.0.0.1'\n" + first_toml),
        second_toml(second_toml) {
    start_second();
    LibvirtOptions options;
    options.uri = ensure_second_libvirtd();
    auto opened = open_libvirt(options);
    if (!opened) throw std::runtime_error(opened.error().message());
    libvirt2 = std::move(*opened);
  }

  // c2's agent (again, after it was stopped).
  void start_second() {
    const std::string second_uri = ensure_second_libvirtd();
    second = host.servers.start_compute("c2", "VCPU:4,MEMORY_MB:2048,DISK_GB:20", &rp2, {"--libvirt-uri", second_uri},
                                        "domain_type = 'qemu'\n"
                                        "image_dir = '" + host.images + "'\n"
                                        "network = 'default'\n"
                                        "stop_timeout = 20\n"
                                        "console_interval = 0.5\n"
                                        "move_libvirt_uri = '" + (second_move_uri.empty() ? second_uri : second_move_uri) + "'\n"
                                        "move_address = '127.0.0.1'\n"
                                        // Two daemons in one network namespace share the kernel's
                                        // ebtables: each one's nwfilter tears down and builds
                                        // chains named by tap device, and at once they break each
                                        // other's ("RULE_DELETE failed"). Filters on one side
                                        // only; moves back to c1 check its filter.
                                        "guest_filter = ''\n" + second_toml);
  }

  DomainState state2(const std::string& uuid) {
    auto state = libvirt2->state(uuid);
    return state ? *state : DomainState::absent;
  }
  std::string log1(const std::string& uuid) const { return host.instances + "/" + uuid + "/console.log"; }
  std::string log2(const std::string& uuid) const { return instances2 + "/" + uuid + "/console.log"; }
  std::string output() const { return host.compute->output() + "\n--- c2 ---\n" + second->output(); }

  // `count` tiny guests on c1, counting; `extra` for the schedule.
  std::vector<std::string> guests_on_first(int count, const std::vector<std::string>& extra = {}) {
    REQUIRE(host.servers.toyvm({"host", "disable", "c2"}).exit_code == 0);
    std::vector<std::string> argv{"schedule", flavor, "--image", "tiny", "--count", std::to_string(count), "--wait",
                                  "--timeout", std::to_string(int(boot_timeout_s))};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto scheduled = host.servers.toyvm(argv, boot_timeout_s + 30);
    INFO(scheduled.out << scheduled.err);
    REQUIRE(scheduled.exit_code == 0);
    std::vector<std::string> uuids;
    std::istringstream lines(scheduled.out);
    for (std::string line; std::getline(lines, line);)
      if (auto [target, uuid] = parse_notified(line + "\n"); !uuid.empty()) uuids.push_back(uuid);
    REQUIRE(int(uuids.size()) == count);
    REQUIRE(host.servers.toyvm({"host", "enable", "c2"}).exit_code == 0);
    REQUIRE(wait_for([&] { return host_record(host.servers, rp2) && host_record(host.servers, rp2)->status == "READY"; }, 30));
    for (const std::string& uuid : uuids) {
      REQUIRE(record_of(host.servers, uuid).host == host.rp);
      REQUIRE(wait_for([&] { return last_tick(read_file(log1(uuid))) >= 2; }, boot_timeout_s));
    }
    return uuids;
  }
  std::string guest_on_first() { return guests_on_first(1).front(); }

  std::optional<MoveRecord> move_of(const std::string& uuid) {
    auto kvs = host.servers.etcd_prefix(KeyLayout().move(uuid));
    if (kvs.empty()) return std::nullopt;
    auto move = decode_move(kvs.front().value);
    return move ? std::optional<MoveRecord>(*move) : std::nullopt;
  }

  // A live move of `uuid` asked, returning once the source's libvirt is sending the guest: c1's,
  // or (from_first false, a move back) c2's.
  void migrate_until_sending(const std::string& uuid, bool from_first = true) {
    auto asked = host.servers.toyvm({"migrate", uuid, "--no-wait"});
    REQUIRE(asked.exit_code == 0);
    REQUIRE(wait_for([&] {
      auto sending = (from_first ? host.libvirt.get() : libvirt2.get())->migrating(uuid);
      return sending && *sending;
    }, 120));
  }

  // After a move met a fault: once its record is gone the guest runs in one place, where its
  // record says, counting on from `ticks`, with the books there. `from_first`: the move's
  // source was c1 (else c2).
  void expect_one_running_copy(const std::string& uuid, int ticks, bool from_first = true) {
    REQUIRE(wait_for([&] { return !move_of(uuid); }, 180));
    const bool moved = record_of(host.servers, uuid).host == (from_first ? rp2 : host.rp);
    INFO((moved ? "moved" : "undone"));
    const bool on_first = moved != from_first;
    auto state_on = [&](bool first) { return first ? host.domain_state(uuid) : state2(uuid); };
    // Undone by the source, the record may go before the destination has removed what it had.
    CHECK(wait_for([&] {
      return state_on(on_first) == DomainState::running && state_on(!on_first) == DomainState::absent;
    }, 60));
    expect_books_on(uuid, on_first ? host.rp : rp2);
    const std::string log = on_first ? log1(uuid) : log2(uuid);
    INFO(output());
    CHECK(wait_for([&] { return last_tick(read_file(log)) > ticks; }, 60));
    // The other host does not run it too.
    CHECK_FALSE(wait_for([&] { return state_on(!on_first) != DomainState::absent; }, 5));
  }

  // The books as they should be: the instance holds only its host, no move in flight, and
  // audit finds nothing wrong (no migration consumer left holding anything).
  void expect_books_on(const std::string& uuid, const std::string& rp) {
    auto held = host.servers.allocations(uuid);
    CHECK(held.size() == 1);
    CHECK(held.count(rp) == 1);
    CHECK(host.servers.etcd_prefix(KeyLayout().move(uuid)).empty());
    // The agents publish what their libvirt has as its events reach them: a destination's
    // guest that libvirt dropped with the aborted send leaves its key a moment after.
    CommandResult audited;
    const bool clean = wait_for([&] {
      audited = host.servers.toyvm({"audit"});
      return audited.exit_code == 0;
    }, 30);
    INFO(audited.out << audited.err);
    CHECK(clean);
  }
};
}  // namespace

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
  CHECK(there.out == "MIGRATED INSTANCE " + uuid + " TO " + hosts.rp2 + "\n");
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

TEST_CASE("a live move that cannot converge: aborted at its completion timeout, by --abort or by a stop, the same "
          "QEMU running on where it was", "[guests]") {
  // 4 s per GiB of memory and disk: 4.5 s for this guest, whose 128 MiB of memory alone take
  // two minutes over a link throttled to 1 MiB/s.
  TwoHosts hosts("live_migration_completion_timeout = 4\n");
  Servers& servers = hosts.host.servers;
  const auto guests = hosts.guests_on_first(2);
  const std::string& uuid = guests[0];
  const std::string& other = guests[1];  // the host's other guest, which never waits behind a send
  const pid_t qemu = qemu_pid(uuid);
  REQUIRE(qemu > 0);
  auto throttle = [&] { REQUIRE(virsh({"migrate-setspeed", domain_name(uuid), "1"}).exit_code == 0); };
  throttle();
  auto stays_here = [&](const std::string& why) {
    INFO(why << "\n" << hosts.output());
    CHECK(qemu_pid(uuid) == qemu);  // never booted again, never a second copy
    CHECK(hosts.host.domain_state(uuid) == DomainState::running);
    CHECK(wait_for([&] { return hosts.state2(uuid) == DomainState::absent; }, 60));
    hosts.expect_books_on(uuid, hosts.host.rp);
  };

  const int ticks = last_tick(read_file(hosts.log1(uuid)));
  auto timed_out = servers.toyvm({"migrate", uuid}, 180);
  INFO(timed_out.out << timed_out.err);
  CHECK(timed_out.exit_code == 5);
  CHECK_THAT(timed_out.err, Catch::Contains("did not complete within 4 s") && Catch::Contains("aborted"));
  stays_here("after the timeout");
  CHECK(wait_for([&] { return last_tick(read_file(hosts.log1(uuid))) > ticks; }, 60));

  // The same throttled link with the default timeout: the send runs on until it is ended.
  hosts.host.compute->signal(SIGTERM);
  REQUIRE(hosts.host.compute->wait(30) == 0);
  const std::string short_timeout = "live_migration_completion_timeout = 4\n";
  hosts.host.compute_toml.replace(hosts.host.compute_toml.find(short_timeout), short_timeout.size(), "");
  hosts.host.start_agent();
  auto sending = [&] {
    return wait_for([&] {
      auto job = hosts.host.libvirt->migrating(uuid);
      return job && *job;
    }, 120);
  };
  // An operator aborts it while it is sent.
  throttle();
  auto migrating = servers.spawn_toyvm({"migrate", uuid, "--timeout", "120"}, "migrate.log");
  REQUIRE(sending());
  // Sends run on threads of their own: the host's other guest stops and starts meanwhile.
  auto other_stopped = servers.toyvm({"stop", other, "--timeout", "60"}, 90);
  auto other_started = servers.toyvm({"start", other, "--timeout", "60"}, 90);
  {
    INFO(other_stopped.err << other_started.err << hosts.output());
    CHECK(other_stopped.exit_code == 0);
    CHECK(other_started.exit_code == 0);
    auto job = hosts.host.libvirt->migrating(uuid);
    CHECK((job && *job));  // the send ran on all along
  }
  auto aborted = servers.toyvm({"migrate", uuid, "--abort"}, 120);
  INFO(aborted.out << aborted.err << migrating->output());
  CHECK(aborted.exit_code == 0);
  CHECK_THAT(aborted.out, Catch::Contains("ABORTED MOVE OF INSTANCE " + uuid + ": it stays on " + hosts.host.rp));
  CHECK(migrating->wait(60) == 5);
  CHECK_THAT(migrating->output(), Catch::Contains("an operator aborted it"));
  stays_here("after --abort");

  // A stop asked while it is sent ends the send first, then powers it off where it is.
  throttle();
  auto migrating_again = servers.spawn_toyvm({"migrate", uuid, "--timeout", "120"}, "migrate-again.log");
  REQUIRE(sending());
  auto stopped = servers.toyvm({"stop", uuid, "--timeout", "60"}, 90);
  INFO(stopped.out << stopped.err << migrating_again->output() << hosts.output());
  CHECK(stopped.exit_code == 0);
  CHECK(migrating_again->wait(60) == 5);
  CHECK(hosts.host.domain_state(uuid) == DomainState::stopped);
  CHECK(hosts.state2(uuid) == DomainState::absent);
  CHECK(record_of(servers, uuid).state == InstanceState::stopped);
  hosts.expect_books_on(uuid, hosts.host.rp);
  for (const std::string& guest : guests) CHECK(servers.toyvm({"destroy", guest}).exit_code == 0);
}

TEST_CASE("a move whose destination's agent died before it prepared is undone: the guest runs on, the books "
          "are as before", "[guests]") {
  TwoHosts hosts("move_prepare_timeout = 5\n");
  Servers& servers = hosts.host.servers;
  const std::string uuid = hosts.guest_on_first();
  // Killed: its host record stays until its lease expires, so the move is asked of it.
  hosts.second->signal(SIGKILL);
  hosts.second->wait();
  auto moved = servers.toyvm({"migrate", uuid, "--host", "c2"}, 120);
  INFO(moved.out << moved.err << hosts.output());
  CHECK(moved.exit_code == 5);
  CHECK_THAT(moved.err, Catch::Contains("did not prepare for it within 5 s"));
  CHECK(record_of(servers, uuid).host == hosts.host.rp);
  CHECK(hosts.host.domain_state(uuid) == DomainState::running);
  CHECK(hosts.state2(uuid) == DomainState::absent);
  hosts.expect_books_on(uuid, hosts.host.rp);
  const int ticks = last_tick(read_file(hosts.log1(uuid)));
  CHECK(wait_for([&] { return last_tick(read_file(hosts.log1(uuid))) > ticks; }, 30));
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
}

TEST_CASE("a move whose source's agent is killed as the guest leaves ends with one running copy, where its "
          "record says", "[guests]") {
  TwoHosts hosts;
  Servers& servers = hosts.host.servers;
  const std::string uuid = hosts.guest_on_first();
  const int ticks = last_tick(read_file(hosts.log1(uuid)));
  auto asked = servers.toyvm({"migrate", uuid, "--no-wait"});
  REQUIRE(asked.exit_code == 0);
  // Killed once the destination is ready, when the source has begun to send the guest.
  REQUIRE(wait_for([&] {
    auto move = hosts.move_of(uuid);
    return move && move->state == MoveState::ready;
  }, 60));
  hosts.host.compute->signal(SIGKILL);
  hosts.host.compute->wait();
  // However libvirt ends the job the agent started, the guest ends up running in one place: the
  // destination's agent switches it over once it runs there, or the source's, started again,
  // sends it once more, or undoes the move when that fails.
  hosts.host.start_agent();
  INFO(hosts.output());
  hosts.expect_one_running_copy(uuid, ticks);
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
}

TEST_CASE("a cold move whose destination's agent is killed once the disk is there is finished when it comes back; "
          "until then the source keeps its copy", "[guests]") {
  TwoHosts hosts;
  Servers& servers = hosts.host.servers;
  const std::string uuid = hosts.guest_on_first();
  REQUIRE(servers.toyvm({"stop", uuid, "--timeout", "60"}, 90).exit_code == 0);
  const std::string paused = servers.dir() + "/receive-paused";
  std::ofstream(paused) << "";
  {
    // c2 again, stopping where its disk has come and its domain is not yet defined.
    ScopedEnv failpoints("TOYVM_FAILPOINTS", "move.receive=pause(" + paused + ")");
    hosts.second->signal(SIGTERM);
    hosts.second->wait();
    hosts.start_second();
  }
  auto asked = servers.toyvm({"migrate", uuid, "--host", "c2", "--no-wait"});
  REQUIRE(asked.exit_code == 0);
  INFO(hosts.output());
  REQUIRE(wait_for([&] {
    auto move = hosts.move_of(uuid);
    return move && move->state == MoveState::copied;
  }, 120));
  hosts.second->signal(SIGKILL);
  hosts.second->wait();
  // Unknown is not gone: the source's copy stays, off, while the move waits for its destination.
  CHECK_FALSE(wait_for([&] { return !hosts.move_of(uuid); }, 3));
  CHECK(hosts.host.domain_state(uuid) == DomainState::stopped);
  CHECK(fs::exists(hosts.host.overlay(uuid)));
  CHECK(record_of(servers, uuid).host == hosts.host.rp);
  CHECK_THAT(servers.toyvm({"show", uuid}).out, Catch::Contains("moving: cold to host " + hosts.rp2 + " (copied)"));

  hosts.start_second();
  REQUIRE(wait_for([&] { return !hosts.move_of(uuid); }, 120));
  CHECK(record_of(servers, uuid).host == hosts.rp2);
  CHECK(record_of(servers, uuid).state == InstanceState::stopped);
  CHECK(hosts.state2(uuid) == DomainState::stopped);
  CHECK(wait_for([&] { return hosts.host.domain_state(uuid) == DomainState::absent; }, 30));
  CHECK_FALSE(fs::exists(hosts.host.overlay(uuid)));
  hosts.expect_books_on(uuid, hosts.rp2);
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
  hosts.host.expect_nothing_held(uuid);
}

TEST_CASE("a cold move that cannot copy the disk is undone, and the guest it powered off runs again where it was",
          "[guests]") {
  TwoHosts hosts;
  Servers& servers = hosts.host.servers;
  const std::string uuid = hosts.guest_on_first();
  // c2 says it is reached where no libvirtd listens.
  hosts.second->signal(SIGTERM);
  hosts.second->wait();
  hosts.second_move_uri = "qemu+tcp://127.0.0.1:1/system";
  hosts.start_second();
  auto moved = servers.toyvm({"migrate", uuid, "--host", "c2", "--cold"}, 300);
  INFO(moved.out << moved.err << hosts.output());
  CHECK(moved.exit_code == 5);
  CHECK_THAT(moved.err, Catch::Contains("cannot reach qemu+tcp://127.0.0.1:1/system"));
  CHECK(record_of(servers, uuid).host == hosts.host.rp);
  CHECK(hosts.state2(uuid) == DomainState::absent);
  hosts.expect_books_on(uuid, hosts.host.rp);
  // Started again, not left off as if its guest had powered itself off.
  CHECK(wait_for([&] { return hosts.host.domain_state(uuid) == DomainState::running; }, 30));
  CHECK(wait_for_record(servers, uuid, [](const InstanceRecord& r) { return r.state == InstanceState::active; }, 30));
  CHECK_FALSE(wait_for([&] { return record_of(servers, uuid).state != InstanceState::active; }, 5));
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
}

TEST_CASE("a live move whose destination's libvirtd is killed while the guest is sent ends with one running copy, "
          "the books where it runs", "[guests]") {
  TwoHosts hosts;
  Servers& servers = hosts.host.servers;
  const std::string uuid = hosts.guest_on_first();
  const int ticks = last_tick(read_file(hosts.log1(uuid)));
  hosts.migrate_until_sending(uuid);
  kill_and_restart_second_libvirtd();
  INFO(hosts.output());
  hosts.expect_one_running_copy(uuid, ticks);
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
}

TEST_CASE("a live move whose source's libvirtd is killed while the guest is sent ends with one running copy, the "
          "books where it runs", "[guests]") {
  TwoHosts hosts;
  Servers& servers = hosts.host.servers;
  const std::string uuid = hosts.guest_on_first();
  auto there = servers.toyvm({"migrate", uuid, "--host", "c2"}, 300);
  INFO(there.out << there.err << hosts.output());
  REQUIRE(there.exit_code == 0);
  REQUIRE(wait_for([&] { return last_tick(read_file(hosts.log2(uuid))) > 0; }, 60));
  const int ticks = last_tick(read_file(hosts.log2(uuid)));
  // Back to c1: the second daemon is the source now, and dies while its libvirt sends the guest.
  hosts.migrate_until_sending(uuid, false);
  kill_and_restart_second_libvirtd();
  hosts.expect_one_running_copy(uuid, ticks, false);
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
}

TEST_CASE("a live move that etcd and Placement both go away under while the guest is sent is finished once they are "
          "back: one running copy, books exact", "[guests]") {
  TwoHosts hosts;
  Servers& servers = hosts.host.servers;
  const std::string uuid = hosts.guest_on_first();
  const int ticks = last_tick(read_file(hosts.log1(uuid)));
  hosts.migrate_until_sending(uuid);
  servers.stop_etcd();
  servers.stop_placement();
  INFO(hosts.output());
  // libvirt finishes sending it; nobody can record that meanwhile, and nobody acts on a guess.
  CHECK(wait_for([&] {
    return hosts.state2(uuid) == DomainState::running && hosts.host.domain_state(uuid) == DomainState::absent;
  }, 120));
  servers.start_etcd_again();
  servers.start_placement_again();
  REQUIRE(wait_for([&] { return !hosts.move_of(uuid); }, 180));
  CHECK(record_of(servers, uuid).host == hosts.rp2);
  CHECK(hosts.host.domain_state(uuid) == DomainState::absent);
  hosts.expect_books_on(uuid, hosts.rp2);
  CHECK(wait_for([&] { return last_tick(read_file(hosts.log2(uuid))) > ticks; }, 60));
  CHECK(read_file(hosts.log2(uuid)).find("toyvm-guest: booted") == std::string::npos);
  CHECK(servers.toyvm({"destroy", uuid}).exit_code == 0);
}
