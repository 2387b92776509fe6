// Real guests on hosts that share a machine: agents sharing one libvirtd, each with its own
// network, a libvirtd restarted, a second libvirtd as a second host, a guest moved live to it.

#include "guests.hpp"

#include "catch_result.hpp"

using namespace toyvm;
using namespace toyvm::test;

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
