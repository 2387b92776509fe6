#pragma once
// What the real-guest tests share: a host with an agent on qemu:///system (the libvirtd the
// tests start) and contrib/tiny-guest.sh's image, a second host on a second libvirtd, and
// readers of what the guests and libvirt leave behind.

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

namespace toyvm::test {

namespace fs = std::filesystem;

inline const std::string flavor = "resources=VCPU:1,MEMORY_MB:128,DISK_GB:1";
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
inline CommandResult virsh(std::vector<std::string> args) {
  TempDir dir;
  args.insert(args.begin(), {"virsh", "-q", "-c", "qemu:///system"});
  return run_command(args, dir.path());
}

inline bool network_active(const std::string& network) {
  return virsh({"net-info", network}).out.find("Active:         yes") != std::string::npos;
}

inline InstanceRecord record_of(const Servers& servers, const std::string& uuid) {
  auto kvs = servers.etcd_prefix(KeyLayout().instance(uuid));
  REQUIRE(kvs.size() == 1);
  auto record = decode_instance(kvs.front().value);
  REQUIRE(record);
  return *record;
}


// The pid of the instance's QEMU, as libvirt wrote it down.
inline pid_t qemu_pid(const std::string& uuid) {
  std::string text = read_file("/run/libvirt/qemu/" + domain_name(uuid) + ".pid");
  return text.empty() ? 0 : pid_t(std::stol(text));
}

inline bool work_power_is(const GuestHost& host, const std::string& uuid, PowerState power) {
  auto kvs = host.servers.etcd_prefix(KeyLayout().work(host.rp, uuid));
  if (kvs.size() != 1) return false;
  auto spec = decode_work(kvs.front().value);
  return spec && spec->power == power;
}

// The number of the last heartbeat ("toyvm-guest: tick N uptime U") in a console log; 0: none.
inline int last_tick(const std::string& log) {
  const std::string mark = "toyvm-guest: tick ";
  const size_t at = log.rfind(mark);
  return at == std::string::npos ? 0 : std::atoi(log.c_str() + at + mark.size());
}

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

}  // namespace toyvm::test
