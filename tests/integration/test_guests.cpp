// Real guests: QEMU under TCG through qemu:///system, with a libvirtd these tests start.
// The guest is contrib/tiny-guest.sh's: Debian's kernel and a busybox initramfs that prints
// markers on its serial console, asks DHCP for an address, reads its metadata, and powers
// off on ACPI's power button.

#include "harness.hpp"
#include "model/image.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "virt/backend.hpp"

#include "catch_result.hpp"

#include <filesystem>
#include <fstream>

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
  std::unique_ptr<Process> mdserver;
  std::unique_ptr<VirtBackend> libvirt;  // the tests' own view of qemu:///system

  GuestHost() {
    ensure_libvirtd();
    images = servers.dir() + "/images";
    instances = servers.dir() + "/c1/instances";
    fs::create_directories(images + "/tiny");
    for (const char* file : {"kernel", "initrd", "cmdline", "disk.raw"})
      fs::copy_file(tiny_guest_dir() + "/" + file, images + "/tiny/" + file);
    compute = servers.start_compute("c1", "VCPU:4,MEMORY_MB:2048,DISK_GB:20", &rp,
                                    {"--libvirt-uri", "qemu:///system"},
                                    "domain_type = 'qemu'\n"
                                    "image_dir = '" + images + "'\n"
                                    "network = 'default'\n"
                                    "nic_model = 'e1000'\n"
                                    "stop_timeout = 20\n"
                                    "console_interval = 0.5\n");
    std::string detail;
    LibvirtOptions system;
    system.uri = "qemu:///system";
    auto opened = open_libvirt(system, &detail);
    if (!opened) throw std::runtime_error(detail);
    libvirt = std::move(*opened);
  }

  // The metadata service where guests look for it: 169.254.169.254 on the default network's
  // bridge (the agent has started that network by now).
  void serve_metadata() {
    if (std::system("ip addr replace 169.254.169.254/32 dev virbr0") != 0)
      throw std::runtime_error("cannot put the metadata address on virbr0");
    mdserver = servers.spawn_toyvm({"mdserver", "--listen", "169.254.169.254:80"}, "mdserver.log");
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

  DomainState domain_state(const std::string& uuid) { return libvirt->state(uuid).value; }

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

InstanceRecord record_of(const Servers& servers, const std::string& uuid) {
  auto kvs = servers.etcd_prefix(KeyLayout().instance(uuid));
  REQUIRE(kvs.size() == 1);
  auto record = decode_instance(kvs.front().value);
  REQUIRE(record);
  return *record;
}

}  // namespace

TEST_CASE("a tiny guest boots under TCG, gets an address by DHCP and reads its own metadata", "[guests]") {
  GuestHost host;
  host.serve_metadata();
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
  auto disk = probe_disk(head, fs::file_size(host.overlay(uuid)), nullptr);
  CHECK_FALSE(disk);  // it has a backing file: toyvm would never accept it as an image
  REQUIRE(head.size() >= 32);
  uint64_t virtual_size = 0;
  for (int i = 24; i < 32; ++i) virtual_size = (virtual_size << 8) | uint8_t(head[i]);
  CHECK(virtual_size == uint64_t(1) << 30);
  CHECK(fs::file_size(host.overlay(uuid)) < fs::file_size(host.images + "/tiny/disk.raw"));

  CHECK(host.servers.toyvm({"destroy", uuid}).exit_code == 0);
  host.expect_nothing_left(uuid);
}

TEST_CASE("stop, start and destroy a real guest", "[guests]") {
  GuestHost host;
  std::string uuid = host.schedule({"--image", "tiny"});
  REQUIRE(host.domain_state(uuid) == DomainState::running);
  REQUIRE(host.console_shows(uuid, "toyvm-guest: address"));

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
