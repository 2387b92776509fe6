// Watching what toyvm runs: work an agent cannot read, audit, Prometheus metrics, and what an
// instance uses, against a real etcd and Placement.

#include "operations.hpp"

#include "catch_result.hpp"

using namespace toyvm;
using namespace toyvm::test;

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
