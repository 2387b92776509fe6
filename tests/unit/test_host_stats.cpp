#include "model/host_stats.hpp"
#include "model/usage.hpp"
#include "virt/memory_backend.hpp"

#include "catch_result.hpp"

using namespace toyvm;

namespace {
constexpr const char* meminfo = R"(MemTotal:       24568312 kB
MemFree:        20145100 kB
MemAvailable:   22891004 kB
Buffers:           81236 kB
Cached:          2419716 kB
Active:          1198820 kB
Inactive:        2417696 kB
Active(anon):     170392 kB
Inactive(anon):        0 kB
Active(file):    1028428 kB
Inactive(file):  2417696 kB
)";
}

TEST_CASE("memory available is counted as CIAO counts it: MemFree + Active(file) + Inactive(file)") {
  auto memory = parse_meminfo(meminfo);
  REQUIRE(memory);
  CHECK(memory->total_mb == 24568312 / 1024);
  CHECK(memory->available_mb == (20145100 + 1028428 + 2417696) / 1024);
}

TEST_CASE("meminfo without one of the fields gives nothing rather than a wrong figure") {
  CHECK_FALSE(parse_meminfo("MemTotal: 1000 kB\nMemFree: 500 kB\nActive(file): 10 kB\n"));
  CHECK_FALSE(parse_meminfo(""));
  CHECK_FALSE(parse_meminfo("MemTotal: lots\nMemFree: 1 kB\nActive(file): 1 kB\nInactive(file): 1 kB\n"));
}

TEST_CASE("the load is loadavg's one-minute figure") {
  CHECK(parse_loadavg("0.52 0.58 0.59 1/389 12345\n") == 0.52);
  CHECK(parse_loadavg("12.00 1 1 1/1 1") == 12.0);
  CHECK_FALSE(parse_loadavg("garbage"));
  CHECK_FALSE(parse_loadavg(""));
}

TEST_CASE("CPUs online are the cpuN lines of /proc/stat, not the total") {
  CHECK(count_online_cpus("cpu  1 2 3\ncpu0 1 2 3\ncpu1 4 5 6\nintr 1 2\nctxt 5\n") == 2);
  CHECK(count_online_cpus("cpu  1 2 3\nintr 1\n") == 0);
}

TEST_CASE("this host can be measured") {
  auto stats = measure_host_stats("/");
  REQUIRE(stats);
  CHECK(stats->mem_total_mb > 0);
  CHECK(stats->mem_available_mb <= stats->mem_total_mb);
  CHECK(stats->disk_total_mb > 0);
  CHECK(stats->disk_available_mb <= stats->disk_total_mb);
  CHECK(stats->cpus_online >= 1);
  CHECK(stats->at > 0);
  CHECK_FALSE(measure_host_stats("/no/such/dir"));
}

TEST_CASE("host stats and an operator's disable survive a round trip; garbage does not decode") {
  HostStats stats{24000, 20000, 100000, 80000, 0.75, 2, 1700000000};
  auto back = decode_host_stats(encode(stats));
  REQUIRE(back);
  CHECK(*back == stats);
  HostMaintenance disabled{"disk \"replacement\"", 1700000001};
  auto again = decode_maintenance(encode(disabled));
  REQUIRE(again);
  CHECK(*again == disabled);
  CHECK_FALSE(decode_host_stats("{\"load\": \"high\"}"));
  CHECK_FALSE(decode_maintenance("not json"));
  CHECK_FALSE(decode_maintenance("{\"reason\": 5}"));
}

TEST_CASE("an instance's CPU share is its busy time over the window, across all its vCPUs") {
  DomainUsage first{.running = true, .vcpus = 2, .cpu_time_ns = 10'000'000'000, .memory_kib = 262144};
  DomainUsage second = first;
  second.cpu_time_ns += 500'000'000;  // half a second of CPU in one second, on two vCPUs
  second.rss_kib = 180 * 1024;
  second.disk_capacity = int64_t(1) << 30;
  second.disk_allocation = 3 << 20;
  InstanceUsage usage = usage_between(first, second, 1.0);
  CHECK(usage.running);
  CHECK(usage.cpu_time_s == Approx(10.5));
  CHECK(usage.cpu_share == Approx(0.25));
  CHECK(usage.memory_mb == 256);
  CHECK(usage.rss_mb == 180);
  CHECK(usage.disk_allocation == 3 << 20);
  CHECK(decode_usage(encode(usage)).value() == usage);
}

TEST_CASE("a stopped instance, or one whose counter went back (it restarted), has no CPU share") {
  DomainUsage first{.running = true, .vcpus = 1, .cpu_time_ns = 9'000'000'000};
  DomainUsage restarted{.running = true, .vcpus = 1, .cpu_time_ns = 1'000'000};
  CHECK(usage_between(first, restarted, 1.0).cpu_share == 0);
  DomainUsage stopped{.running = false, .vcpus = 1};
  InstanceUsage off = usage_between(stopped, stopped, 0);
  CHECK_FALSE(off.running);
  CHECK(off.cpu_share == 0);
  CHECK(off.rss_mb == -1);
  CHECK(off.disk_capacity == -1);
  CHECK(decode_usage(encode(off)).value() == off);  // unknown figures travel as null
  // More busy time than the window holds (the samples' clocks differ) is capped at all of them.
  DomainUsage busy = first;
  busy.cpu_time_ns += 3'000'000'000;
  CHECK(usage_between(first, busy, 1.0).cpu_share == 1.0);
}

TEST_CASE("a usage record from etcd that is not an object is an error, not a crash") {
  CHECK_FALSE(decode_usage("[1,2]"));
  CHECK_FALSE(decode_usage("{\"vcpus\": \"two\"}"));
}

TEST_CASE("a host's figures are written again only once they moved enough", "[host_stats]") {
  const HostStats reported{.mem_total_mb = 16000, .mem_available_mb = 8000, .disk_total_mb = 100000,
                           .disk_available_mb = 50000, .load = 0.5, .cpus_online = 8, .at = 1000};
  HostStats now = reported;
  now.at = 1030;  // only time passed
  CHECK_FALSE(worth_reporting(reported, now));
  now.mem_available_mb = 8000 - 799;  // less than a twentieth of the total
  now.disk_available_mb = 50000 + 4999;
  now.load = 1.49;
  CHECK_FALSE(worth_reporting(reported, now));
  HostStats memory = reported;
  memory.mem_available_mb = 8000 - 800;
  CHECK(worth_reporting(reported, memory));
  HostStats disk = reported;
  disk.disk_available_mb = 50000 - 5000;
  CHECK(worth_reporting(reported, disk));
  HostStats load = reported;
  load.load = 1.5;
  CHECK(worth_reporting(reported, load));
  HostStats cpus = reported;
  cpus.cpus_online = 7;
  CHECK(worth_reporting(reported, cpus));
  HostStats grown = reported;
  grown.disk_total_mb = 200000;
  CHECK(worth_reporting(reported, grown));
}

TEST_CASE("a simulated host reports its own machine less what its running guests take", "[host_stats]") {
  MemoryVirt machine;
  machine.set_machine(4096, 40, 4);
  auto idle = machine.host_stats();
  REQUIRE(idle);
  CHECK(idle->mem_total_mb == 4096);
  CHECK(idle->mem_available_mb == 4096);
  CHECK(idle->disk_available_mb == 40 * 1024);
  CHECK(idle->cpus_online == 4);
  CHECK(idle->load == 0);
  auto guest = [](std::string uuid, int64_t memory_mb, int64_t disk_gb, bool start) {
    DomainSpec spec;
    spec.uuid = spec.name = std::move(uuid);
    spec.memory_mb = memory_mb;
    spec.disk_gb = disk_gb;
    spec.start = start;
    return spec;
  };
  REQUIRE(machine.create(guest("a", 1024, 10, true)));
  REQUIRE(machine.create(guest("b", 512, 5, false)));
  auto busy = machine.host_stats();
  REQUIRE(busy);
  CHECK(busy->mem_available_mb == 4096 - 1024);  // a guest that is off holds no memory
  CHECK(busy->disk_available_mb == (40 - 15) * 1024);
  CHECK(worth_reporting(*idle, *busy));
  CHECK_FALSE(worth_reporting(*busy, *machine.host_stats()));  // nothing moved: nothing written
}
