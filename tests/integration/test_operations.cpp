// Operating hosts: their figures, and taking them out of service, against a real etcd and
// Placement.

#include "harness.hpp"
#include "model/keys.hpp"
#include "model/moves.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"

#include "catch_result.hpp"

#include <boost/json/parse.hpp>
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

using namespace toyvm;
using namespace toyvm::test;
namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

const std::string small = "resources=VCPU:1,MEMORY_MB:64";
const std::string roomy = "VCPU:1000,DISK_GB:10000,MEMORY_MB:100000";

std::optional<HostStats> host_stats(const Servers& servers, const std::string& rp) {
  auto kvs = servers.etcd_prefix(KeyLayout().stats(rp));
  if (kvs.empty()) return std::nullopt;
  auto stats = decode_host_stats(kvs.front().value);
  return stats ? std::optional<HostStats>(*stats) : std::nullopt;
}

std::optional<InstanceState> record_of_state(const Servers& servers, const std::string& uuid) {
  auto kvs = servers.etcd_prefix(KeyLayout().instance(uuid));
  if (kvs.empty()) return std::nullopt;
  auto record = decode_instance(kvs.front().value);
  return record ? std::optional<InstanceState>(record->state) : std::nullopt;
}

bool has_status(const Servers& servers, const std::string& rp, const std::string& status) {
  auto record = host_record(servers, rp);
  return record && record->status == status;
}

bool provider_disabled(const Servers& servers, const std::string& rp) {
  auto traits = run_sync<std::vector<std::string>>([&](asio::io_context& io) -> awaitable<std::vector<std::string>> {
    PlacementClient placement(io.get_executor(), servers.config.placement);
    auto t = co_await placement.traits(rp);
    co_return t ? *t : std::vector<std::string>{};
  });
  return std::find(traits.begin(), traits.end(), "COMPUTE_STATUS_DISABLED") != traits.end();
}

// The host's object in `show --hosts --json`.
json::object shown_host(const Servers& servers, const std::string& rp) {
  auto shown = servers.toyvm({"show", "--hosts", "--json"});
  REQUIRE(shown.exit_code == 0);
  json::value hosts = json::parse(shown.out);
  for (const json::value& host : hosts.as_array())
    if (host.at("provider").as_string() == rp) return host.as_object();
  FAIL("host " << rp << " is not in show --hosts");
  return {};
}

}  // namespace

TEST_CASE("an agent reports its host's memory, disk and load, and show --hosts shows them", "[operations]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp, {}, "stats_interval = 1");
  REQUIRE(wait_for([&] { return host_stats(servers, rp).has_value(); }, 20));
  HostStats first = *host_stats(servers, rp);
  CHECK(first.mem_total_mb > 0);
  CHECK(first.mem_available_mb > 0);
  CHECK(first.mem_available_mb <= first.mem_total_mb);
  CHECK(first.disk_available_mb <= first.disk_total_mb);
  CHECK(first.cpus_online >= 1);
  // Measured again every stats_interval.
  CHECK(wait_for([&] { auto s = host_stats(servers, rp); return s && s->at > first.at; }, 10));

  json::object host = shown_host(servers, rp);
  REQUIRE(host.at("stats").is_object());
  CHECK(host.at("stats").at("mem_total_mb").as_int64() == first.mem_total_mb);
  CHECK(host.at("stats").at("cpus_online").as_int64() == first.cpus_online);
  CHECK(host.at("disabled").is_null());
  auto table = servers.toyvm({"show", "--hosts"});
  CHECK_THAT(table.out, Catch::Contains("MEM_AVAIL_MB") && Catch::Contains(fmt::format("/{}", first.mem_total_mb)));

  // The figures live on the agent's lease: they go with a dead agent.
  compute->signal(SIGKILL);
  CHECK(wait_for([&] { return !host_stats(servers, rp).has_value(); }, 30));
}

TEST_CASE("a disabled host takes no work, across its agent's restarts, until it is enabled", "[operations]") {
  Servers servers;
  std::string rp, other;
  auto compute = servers.start_compute("c1", roomy, &rp, {"--trait", "CUSTOM_C1"});
  auto compute2 = servers.start_compute("c2", roomy, &other, {});
  const std::string on_c1 = small + "&required=CUSTOM_C1";

  auto disabled = servers.toyvm({"host", "disable", "c1", "--reason", "disk replacement"});
  REQUIRE(disabled.exit_code == 0);
  CHECK(disabled.out == fmt::format("DISABLED HOST c1 ({})\n", rp));
  CHECK(wait_for([&] { return has_status(servers, rp, "DISABLED"); }, 10));
  CHECK(provider_disabled(servers, rp));
  CHECK(servers.toyvm({"schedule", on_c1}).out == "NO ALLOCATIONS LEFT\n");
  CHECK(parse_notified(servers.toyvm({"schedule", small}).out).first == other);
  json::object host = shown_host(servers, rp);
  CHECK(host.at("status").as_string() == "DISABLED");
  CHECK(host.at("disabled").at("reason").as_string() == "disk replacement");
  CHECK_THAT(servers.toyvm({"show", "--hosts"}).out, Catch::Contains("disabled: disk replacement"));
  CHECK_FALSE(provider_disabled(servers, other));

  SECTION("a clean stop and a start keep the disable") {
    compute->signal(SIGTERM);
    REQUIRE(compute->wait(20) == 0);
    compute = servers.start_compute("c1", roomy, &rp, {"--trait", "CUSTOM_C1"});
    CHECK(has_status(servers, rp, "DISABLED"));
    CHECK(provider_disabled(servers, rp));
    CHECK(servers.toyvm({"schedule", on_c1}).out == "NO ALLOCATIONS LEFT\n");
  }
  SECTION("a crash and a start keep the disable") {
    compute->signal(SIGKILL);
    compute->wait(20);
    REQUIRE(wait_for([&] { return !host_record(servers, rp).has_value(); }, 30));
    compute = servers.start_compute("c1", roomy, &rp, {"--trait", "CUSTOM_C1"});
    CHECK(has_status(servers, rp, "DISABLED"));
    CHECK(provider_disabled(servers, rp));
    CHECK(servers.toyvm({"schedule", on_c1}).out == "NO ALLOCATIONS LEFT\n");
  }

  auto enabled = servers.toyvm({"host", "enable", "c1"});
  REQUIRE(enabled.exit_code == 0);
  CHECK(enabled.out == fmt::format("ENABLED HOST c1 ({})\n", rp));
  CHECK(wait_for([&] { return has_status(servers, rp, "READY"); }, 10));
  CHECK(wait_for([&] { return !provider_disabled(servers, rp); }, 10));
  CHECK(parse_notified(servers.toyvm({"schedule", on_c1}).out).first == rp);
  CHECK(shown_host(servers, rp).at("disabled").is_null());
}

TEST_CASE("host drain waits for a schedule claimed on the host, which meets the drained host at its hand-over and "
          "goes elsewhere", "[operations]") {
  Servers servers;
  std::string rp, other;
  auto compute = servers.start_compute("c1", roomy, &rp);
  auto compute2 = servers.start_compute("c2", roomy, &other, {"--trait", "CUSTOM_C2"});
  // c2 holds an instance already: spread picks c1, the emptier, for the next one.
  REQUIRE(servers.toyvm({"schedule", "resources=VCPU:100,MEMORY_MB:10000&required=CUSTOM_C2"}).exit_code == 0);
  const std::string paused = servers.dir() + "/schedule-paused";
  std::ofstream(paused) << "";
  std::unique_ptr<Process> schedule;
  {
    ScopedEnv failpoints("TOYVM_FAILPOINTS", "schedule.hand_over=pause(" + paused + ")");
    schedule = servers.spawn_toyvm({"-v", "schedule", small}, "schedule.log");
  }
  REQUIRE(wait_for([&] { return schedule->output().find("failpoint schedule.hand_over: paused") != std::string::npos; },
                   20));
  REQUIRE(servers.usages(rp)["VCPU"] == 1);  // claimed on c1, not handed over yet
  auto held = servers.etcd_prefix(KeyLayout().claims_prefix());
  REQUIRE(held.size() == 1);
  const std::string claimed = held.front().key.substr(KeyLayout().claims_prefix().size());

  // The host holds nothing in etcd yet, but the drain sees the claim and waits for it.
  auto drain = servers.spawn_toyvm({"host", "drain", "c1", "--timeout", "60"}, "drain.log");
  REQUIRE(wait_for([&] { return drain->output().find("WAITING FOR " + claimed) != std::string::npos; }, 20));
  CHECK(drain->running());

  // The hand-over meets the disabled host: the claim goes back and the instance goes to c2.
  fs::remove(paused);
  INFO(schedule->output() << drain->output());
  CHECK(schedule->wait(30) == 0);
  auto [target, uuid] = parse_notified(schedule->output());
  CHECK(uuid == claimed);
  CHECK(target == other);
  CHECK(drain->wait(30) == 0);
  CHECK_THAT(drain->output(), Catch::Contains("GONE " + claimed) &&
                                  Catch::Contains(fmt::format("DRAINED HOST c1 ({}): 0 moved, 0 stayed", rp)));
  CHECK(servers.usages(rp)["VCPU"] == 0);
  CHECK(servers.etcd_prefix(KeyLayout().work_prefix(rp)).empty());
  wait_for_state(servers, uuid, "ACTIVE");
  CHECK(servers.allocations(uuid).count(other) == 1);
  auto audit = servers.toyvm({"audit"});
  INFO(audit.out << audit.err);
  CHECK(audit.exit_code == 0);
}

TEST_CASE("work that reaches a host disabled before it built goes to another host, its attempt unspent",
          "[operations]") {
  Servers servers;
  std::string rp, other;
  const std::string paused = servers.dir() + "/feed-paused";
  std::unique_ptr<Process> compute;
  {
    ScopedEnv failpoints("TOYVM_FAILPOINTS", "feed.batch=pause(" + paused + ")");
    compute = servers.start_compute("c1", roomy, &rp);
  }
  auto compute2 = servers.start_compute("c2", roomy, &other, {"--trait", "CUSTOM_C2"});
  REQUIRE(servers.toyvm({"schedule", "resources=VCPU:100,MEMORY_MB:10000&required=CUSTOM_C2"}).exit_code == 0);
  // c1's agent holds the next work it is handed; meanwhile its host is disabled.
  std::ofstream(paused) << "";
  auto placed = servers.toyvm({"schedule", small});
  auto [target, uuid] = parse_notified(placed.out);
  REQUIRE(target == rp);
  REQUIRE(wait_for([&] { return compute->output().find("failpoint feed.batch: paused") != std::string::npos; }, 20));
  REQUIRE(servers.toyvm({"host", "disable", "c1"}).exit_code == 0);
  fs::remove(paused);
  INFO(compute->output());
  auto record = wait_for_record(servers, uuid, [&](const InstanceRecord& r) {
    return r.host == other && r.state == InstanceState::active;
  });
  REQUIRE(record);
  CHECK(servers.allocations(uuid) == Allocations{{other, {{"VCPU", 1}, {"MEMORY_MB", 64}}}});
  auto works = servers.etcd_prefix(KeyLayout().work(other, uuid));
  REQUIRE(works.size() == 1);
  CHECK(decode_work(works.front().value)->attempt == 1);
  CHECK(servers.etcd_prefix(KeyLayout().work_prefix(rp)).empty());
  auto audit = servers.toyvm({"audit"});
  INFO(audit.out);
  CHECK(audit.exit_code == 0);
}

TEST_CASE("host drain does not call a host empty while something it cannot move holds resources there",
          "[operations]") {
  Servers servers;
  std::string rp, other;
  auto compute = servers.start_compute("c1", roomy, &rp);
  auto compute2 = servers.start_compute("c2", roomy, &other);
  // A claim with no instance behind it (a schedule on its way, or a leak): waited for, then
  // named as what stayed once the timeout passes.
  const std::string leaked = new_uuid();
  servers.claim(leaked, Allocations{{rp, {{"VCPU", 1}}}});
  auto drained = servers.toyvm({"host", "drain", "c1", "--timeout", "2"}, 60);
  INFO(drained.out << drained.err);
  CHECK(drained.exit_code == 5);
  CHECK_THAT(drained.out, Catch::Contains("WAITING FOR " + leaked) &&
                              Catch::Contains("STAYED INSTANCE " + leaked) &&
                              Catch::Contains(fmt::format("DRAINED HOST c1 ({}): 0 moved, 1 stayed", rp)));
  // Once audit gives it back (what the drain's message says) the drain has nothing left to wait for.
  auto fixed = servers.toyvm({"audit", "--fix", "--grace", "0.2"});
  INFO(fixed.out << fixed.err);
  REQUIRE(servers.allocations(leaked).empty());
  auto again = servers.toyvm({"host", "drain", "c1", "--timeout", "2"}, 60);
  INFO(again.out << again.err);
  CHECK(again.exit_code == 0);
  CHECK(again.out == fmt::format("DISABLED HOST c1 ({})\nDRAINED HOST c1 ({}): 0 moved, 0 stayed\n", rp, rp));
}

TEST_CASE("a host disabled while its agent is down comes back disabled", "[operations]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp, {"--trait", "CUSTOM_C1"});
  compute->signal(SIGKILL);  // no clean stop: nothing marked the provider
  compute->wait(20);
  REQUIRE(wait_for([&] { return !host_record(servers, rp).has_value(); }, 30));
  auto disabled = servers.toyvm({"host", "disable", rp});  // by provider uuid
  REQUIRE(disabled.exit_code == 0);
  CHECK(provider_disabled(servers, rp));
  CHECK(shown_host(servers, rp).at("status").as_string() == "DISABLED");
  compute = servers.start_compute("c1", roomy, &rp, {"--trait", "CUSTOM_C1"});
  CHECK(has_status(servers, rp, "DISABLED"));
  CHECK(provider_disabled(servers, rp));
  CHECK(servers.toyvm({"schedule", small + "&required=CUSTOM_C1"}).out == "NO ALLOCATIONS LEFT\n");
  // Enabling a host whose agent is down says so, and leaves the trait to the agent.
  compute->signal(SIGTERM);
  REQUIRE(compute->wait(20) == 0);
  CHECK_FALSE(host_record(servers, rp).has_value());
  auto enabled = servers.toyvm({"host", "enable", "c1"});
  CHECK(enabled.exit_code == 0);
  CHECK_THAT(enabled.err, Catch::Contains("no running agent"));
  compute = servers.start_compute("c1", roomy, &rp, {"--trait", "CUSTOM_C1"});
  CHECK(wait_for([&] { return !provider_disabled(servers, rp); }, 10));
  CHECK(parse_notified(servers.toyvm({"schedule", small + "&required=CUSTOM_C1"}).out).first == rp);
}

TEST_CASE("host disable and enable refuse unknown hosts and say when Placement is down", "[operations]") {
  Servers servers;
  auto unknown = servers.toyvm({"host", "disable", "no-such-host"});
  CHECK(unknown.exit_code == 3);
  CHECK_THAT(unknown.err, Catch::Contains("no host no-such-host"));
  CHECK(servers.toyvm({"host", "enable", "6a1f4a3e-8e4c-4a39-9a53-1d0f2b1f6f00"}).exit_code == 3);
  CHECK(servers.toyvm({"host"}).exit_code == 2);
  CHECK(servers.etcd_prefix(KeyLayout().disabled_prefix()).empty());
  servers.stop_placement();
  auto down = servers.toyvm({"host", "disable", "c1"});
  CHECK(down.exit_code == 4);
  CHECK_THAT(down.err, Catch::Contains("Placement"));
  CHECK(servers.etcd_prefix(KeyLayout().disabled_prefix()).empty());
}

TEST_CASE("show --watch prints each change of state as it happens, for all instances or one", "[operations]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  auto all = servers.spawn_toyvm({"show", "--watch"}, "watch-all.log");
  auto all_json = servers.spawn_toyvm({"show", "--watch", "--json"}, "watch-json.log");
  // Both watch from now on: wait until each has its watch open (a first schedule shows up).
  auto first = parse_notified(servers.toyvm({"schedule", small, "--wait"}).out).second;
  REQUIRE(wait_for([&] { return all->output().find(first) != std::string::npos; }, 10));
  REQUIRE(wait_for([&] { return all_json->output().find(first) != std::string::npos; }, 10));

  // A watcher rides over etcd going away and coming back.
  servers.stop_etcd();
  servers.start_etcd_again();
  auto placed = servers.toyvm({"schedule", small, "--wait"});
  REQUIRE(placed.exit_code == 0);
  const std::string uuid = parse_notified(placed.out).second;
  auto one = servers.spawn_toyvm({"show", "--watch", uuid}, "watch-one.log");
  REQUIRE(servers.toyvm({"stop", uuid}).exit_code == 0);
  REQUIRE(servers.toyvm({"destroy", uuid}).exit_code == 0);
  // Following one instance ends with its deletion.
  CHECK(one->wait(20) == 0);
  CHECK_THAT(one->output(), Catch::Contains(uuid + "  STOPPED") && Catch::Contains(uuid + "  DELETED"));

  auto lines_of = [&](const std::string& text) {
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
      std::string line = text.substr(start, end - start);
      if (line.find(uuid) != std::string::npos) lines.push_back(line);
    }
    return lines;
  };
  REQUIRE(wait_for([&] { return all->output().find(uuid + "  DELETED") != std::string::npos; }, 10));
  auto lines = lines_of(all->output());
  // In order, each state once: a rewrite of the same state is no news.
  std::vector<std::string> states;
  std::string with_address;
  for (const std::string& line : lines) {
    std::string rest = line.substr(line.find(uuid) + uuid.size() + 2);
    std::string state = rest.substr(0, rest.find(' '));
    // A test-driver build is recorded BUILDING only if it took over 100 ms (a loaded machine).
    if (state == "BUILDING" && states.size() == 1) continue;
    if (state == "ACTIVE" && states.size() == 2) with_address = line;
    states.push_back(state);
  }
  CHECK(states == std::vector<std::string>{"SCHEDULED", "ACTIVE", "ACTIVE", "STOPPED", "DELETED"});
  CHECK_THAT(with_address, Catch::Contains("  ip 192.168."));  // the second ACTIVE brings the address
  REQUIRE(wait_for([&] { return lines_of(all_json->output()).size() == lines.size(); }, 10));
  for (const std::string& line : lines_of(all_json->output())) {
    json::value event = json::parse(line);
    CHECK(event.at("uuid").as_string() == uuid);
    CHECK(event.at("time").as_string().size() == 24);
  }
  CHECK(servers.toyvm({"show", "--watch", "6a1f4a3e-8e4c-4a39-9a53-1d0f2b1f6f00"}).exit_code == 3);
  CHECK(all->running());
}

namespace {

// Scrapes `url` and parses it with the Prometheus client's own parser: one line per sample,
// "name label=value,... value"; empty when the scrape or the parse fails.
std::string scrape(const std::string& url) {
  TempDir dir;
  auto parsed = run_command({"/usr/bin/python3", "-c", R"(
import sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
for family in text_string_to_metric_families(text):
    for s in family.samples:
        print(s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())), s.value)
)", url}, dir.path());
  INFO(parsed.err);
  CHECK(parsed.exit_code == 0);
  return parsed.exit_code == 0 ? parsed.out : "";
}

// The value of a sample in scrape()'s output; -1 when it is not there.
double sample(const std::string& samples, const std::string& name, const std::string& labels = "") {
  const std::string prefix = name + " " + labels + " ";
  for (size_t at = 0; (at = samples.find(prefix, at)) != std::string::npos; at += prefix.size())
    if (at == 0 || samples[at - 1] == '\n') return std::stod(samples.substr(at + prefix.size()));
  return -1;
}

// An agent "c1" that serves its metrics at `url`; `more` is more of its [compute] settings.
std::unique_ptr<Process> start_measured_agent(Servers& servers, std::string* rp, std::string* url,
                                              const std::string& more = "") {
  const uint16_t port = free_port();
  *url = "http://127.0.0.1:" + std::to_string(port) + "/metrics";
  return servers.start_compute("c1", roomy, rp, {}, "metrics_listen = '127.0.0.1:" + std::to_string(port) + "'\n" + more);
}

}  // namespace

TEST_CASE("work this agent cannot read leaves its guest and allocation alone, and audit names it", "[operations]") {
  Servers servers;
  std::string rp, url;
  auto compute = start_measured_agent(servers, &rp, &url, "resync_interval = 0.2\n");
  const std::string uuid = parse_notified(servers.toyvm({"schedule", small, "--wait"}).out).second;
  REQUIRE(!uuid.empty());
  REQUIRE(wait_for([&] { return published_domains(servers, rp) == 1; }, 20));
  auto listings = [&] { return sample(scrape(url), "toyvm_work_listings_total"); };

  // What a newer writer (or a hand edit) might leave: a power state this agent does not know.
  const std::string key = KeyLayout().work(rp, uuid);
  std::string value = servers.etcd_prefix(key).front().value;
  const size_t power = value.find("\"power\":\"running\"");
  REQUIRE(power != std::string::npos);
  value.replace(power, 17, "\"power\":\"paused\"");
  servers.etcd_put(key, value);
  REQUIRE(wait_for([&] { return compute->output().find("cannot be read") != std::string::npos; }, 20));
  const double before = listings();
  // Resyncs list it again (the listing where it used to read as "no work"), and the agent
  // restarting its watch lists it again too.
  REQUIRE(wait_for([&] { return listings() >= before + 3; }, 30));
  servers.stop_etcd();
  servers.start_etcd_again();
  REQUIRE(wait_for([&] { return listings() >= before + 5; }, 30));
  CHECK(published_domains(servers, rp) == 1);  // its guest is still there
  CHECK(servers.usages(rp)["VCPU"] == 1);       // and its allocation
  CHECK(servers.allocations(uuid).count(rp) == 1);
  auto shown = servers.toyvm({"show", uuid, "--json"});
  CHECK(json::parse(shown.out).at("usage").is_object());  // its agent measured the domain
  const std::string log = compute->output();
  size_t said = 0;
  for (size_t at = 0; (at = log.find("cannot be read", at)) != std::string::npos; ++at) ++said;
  CHECK(said == 1);  // logged once, not at every resync

  // Once the agent is back on the restarted etcd (its domains published again), only that.
  json::array found;
  CHECK(wait_for([&] {
    auto audit = servers.toyvm({"audit", "--json"});
    found = json::parse(audit.out).at("discrepancies").as_array();
    return audit.exit_code == 1 && found.size() == 1;
  }, 20));
  REQUIRE(found.size() == 1);
  CHECK(found[0].at("kind").as_string() == "unreadable_value");
  CHECK(found[0].at("instance").as_string() == uuid);
  CHECK_FALSE(servers.toyvm({"audit", "--fix", "--grace", "0.1"}).out.find("(fixed)") != std::string::npos);

  // A value it can read again: the instance is the agent's again, and everything agrees.
  value.replace(power, 16, "\"power\":\"stopped\"");
  servers.etcd_put(key, value);
  CHECK(wait_for_record(servers, uuid, [](const InstanceRecord& r) { return r.state == InstanceState::stopped; }));
  auto audit = servers.toyvm({"audit"});
  INFO(audit.out << audit.err);
  CHECK(audit.exit_code == 0);
}

TEST_CASE("audit names an ACTIVE instance whose live host reports no domain for it", "[operations]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  const std::string uuid = parse_notified(servers.toyvm({"schedule", small, "--wait"}).out).second;
  REQUIRE(wait_for([&] { return published_domains(servers, rp) == 1; }, 20));
  servers.etcd_erase(KeyLayout().domain(rp, uuid));  // as if the domain were gone behind toyvm
  auto audit = servers.toyvm({"audit"});
  CHECK(audit.exit_code == 1);
  CHECK_THAT(audit.out, Catch::Contains("instance_without_domain") && Catch::Contains(uuid));
}

TEST_CASE("the agent and the metadata service serve Prometheus metrics, never on the guests' address", "[operations]") {
  Servers servers;
  std::string rp, url;
  auto compute = start_measured_agent(servers, &rp, &url);
  std::vector<std::string> uuids;
  for (int i = 0; i < 2; ++i) uuids.push_back(parse_notified(servers.toyvm({"schedule", small, "--wait"}).out).second);
  REQUIRE(servers.toyvm({"stop", uuids[1]}).exit_code == 0);
  std::string samples = scrape(url);
  CHECK(sample(samples, "toyvm_instances", "state=ACTIVE") == 1);
  CHECK(sample(samples, "toyvm_instances", "state=STOPPED") == 1);
  CHECK(sample(samples, "toyvm_instances", "state=ERROR") == 0);
  CHECK(sample(samples, "toyvm_builds_total", "result=active") == 2);
  CHECK(sample(samples, "toyvm_build_seconds_count") == 2);
  CHECK(sample(samples, "toyvm_build_seconds_bucket", "le=+Inf") == 2);
  CHECK(sample(samples, "toyvm_placement_requests_total", "code=200,method=GET") >= 1);
  CHECK(sample(samples, "toyvm_placement_request_seconds_count") >= 1);
  CHECK(sample(samples, "toyvm_etcd_requests_total", "code=ok") >= 1);
  CHECK(sample(samples, "toyvm_etcd_request_seconds_count") >= 1);
  // etcd going away and coming back ends the agent's watches: they are counted.
  servers.stop_etcd();
  servers.start_etcd_again();
  CHECK(wait_for([&] { return sample(scrape(url), "toyvm_etcd_watch_restarts_total") >= 1; }, 30));

  // The metadata service: requests by code, and those the rate limit refused.
  const uint16_t md_port = free_port(), md_metrics = free_port();
  const std::string config = servers.dir() + "/md.toml";
  std::ofstream(config) << "[mdserver]\nrate_limit = 1\nrate_burst = 2\nmetrics_listen = '127.0.0.1:" << md_metrics
                        << "'\n";
  // Guests reach the metadata service at 127.0.0.2 here; metrics go on another address.
  auto md = servers.spawn_toyvm({"--config", config, "mdserver", "--listen", "127.0.0.2:" + std::to_string(md_port)},
                                "md.log");
  REQUIRE(wait_for([&] { return accepts_connections(md_metrics); }, 20));
  TempDir dir;
  for (int i = 0; i < 5; ++i)
    run_command({"/usr/bin/python3", "-c", "import urllib.request,sys\ntry: urllib.request.urlopen(sys.argv[1])\nexcept Exception: pass",
                 "http://127.0.0.2:" + std::to_string(md_port) + "/latest/meta-data/"}, dir.path());
  std::string md_samples = scrape("http://127.0.0.1:" + std::to_string(md_metrics) + "/metrics");
  CHECK(sample(md_samples, "toyvm_mdserver_requests_total", "code=404") >= 1);  // the test is no guest
  CHECK(sample(md_samples, "toyvm_mdserver_requests_total", "code=429") >= 1);
  CHECK(sample(md_samples, "toyvm_mdserver_rate_limited_total") >= 1);
  CHECK(sample(md_samples, "toyvm_mdserver_request_seconds_count") == 5);

  // Never where guests reach: the metadata address, or the metadata service's own.
  const std::string bad = servers.dir() + "/bad.toml";
  std::ofstream(bad) << "[compute]\nmetrics_listen = '169.254.169.254:9100'\n";
  auto refused = servers.toyvm({"--config", bad, "compute", "--state-dir", servers.dir() + "/bad", "--libvirt-uri",
                                "test:///default", "--inventory", roomy});
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.err, Catch::Contains("guests reach"));
  std::ofstream(bad) << "[mdserver]\nmetrics_listen = '127.0.0.1:" << free_port() << "'\n";
  auto same = servers.toyvm({"--config", bad, "mdserver", "--listen", "127.0.0.1:" + std::to_string(free_port())});
  CHECK(same.exit_code == 2);
}

namespace {

json::object shown_instance(const Servers& servers, const std::string& uuid) {
  auto shown = servers.toyvm({"show", uuid, "--json"});
  INFO(shown.err);
  REQUIRE(shown.exit_code == 0);
  return json::parse(shown.out).as_object();
}

}  // namespace

TEST_CASE("show tells what an instance uses, asked of its agent, and leaves nothing in etcd", "[operations]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  const std::string uuid = parse_notified(servers.toyvm({"schedule", small, "--wait"}).out).second;
  REQUIRE(!uuid.empty());

  json::object usage = shown_instance(servers, uuid).at("usage").as_object();
  CHECK(usage.at("running").as_bool());
  CHECK(usage.at("vcpus").as_int64() == 1);
  CHECK(usage.at("memory_mb").as_int64() == 64);
  CHECK(usage.at("cpu_time_s").as_double() > 0);
  CHECK(usage.at("cpu_share").as_double() >= 0);
  CHECK(usage.at("cpu_share").as_double() <= 1);
  CHECK(usage.at("window_s").as_double() >= 0.9);  // two samples a second apart
  CHECK(usage.at("disk_capacity").is_null());      // no DISK_GB: no overlay
  // The test driver's figures are made up: JSON says so, the text shows none of them.
  CHECK(usage.at("simulated").as_bool());
  auto text = servers.toyvm({"show", uuid});
  CHECK_THAT(text.out, Catch::Contains("usage:  not measured") && !Catch::Contains("cpu:    ") &&
                           !Catch::Contains("memory: "));
  // The request and the answer went with the asker's lease.
  CHECK(servers.etcd_prefix(KeyLayout().usage(uuid)).empty());
  CHECK(servers.etcd_prefix(KeyLayout().usage_requests_prefix(rp)).empty());

  REQUIRE(servers.toyvm({"stop", uuid}).exit_code == 0);
  json::object stopped = shown_instance(servers, uuid).at("usage").as_object();
  CHECK_FALSE(stopped.at("running").as_bool());
  CHECK(stopped.at("cpu_share").as_double() == 0);

  // No agent, no figures: the record is shown all the same, at once.
  compute->signal(SIGKILL);
  compute->wait(20);
  REQUIRE(wait_for([&] { return !host_record(servers, rp).has_value(); }, 30));
  auto without = servers.toyvm({"show", uuid, "--json"});
  CHECK(without.exit_code == 0);
  CHECK_THAT(without.err, Catch::Contains("no running agent"));
  CHECK(json::parse(without.out).at("usage").is_null());
  CHECK(json::parse(without.out).at("state").as_string() == "STOPPED");
}

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
  std::string rp, b;
  auto compute = servers.start_compute("c1", roomy, &rp);
  auto placed = servers.toyvm({"schedule", small, "--wait"}, 60);
  REQUIRE(placed.exit_code == 0);
  const std::string uuid = parse_notified(placed.out).second;
  auto compute_b = servers.start_compute("b", roomy, &b);
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

TEST_CASE("a destination gone for good after its guest left the source: the source hands it over, and evacuating "
          "the dead host rebuilds it", "[operations]") {
  Servers servers;
  std::string rp, b;
  auto compute = servers.start_compute("c1", roomy, &rp);
  auto placed = servers.toyvm({"schedule", small, "--wait"}, 60);
  REQUIRE(placed.exit_code == 0);
  const std::string uuid = parse_notified(placed.out).second;
  auto compute_b = servers.start_compute("b", roomy, &b);
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
