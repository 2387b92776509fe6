#include "model/host_stats.hpp"

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
