// Operating hosts: their figures, and taking them out of service, against a real etcd and
// Placement.

#include "operations.hpp"

#include "catch_result.hpp"

using namespace toyvm;
using namespace toyvm::test;

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
  // Measured every stats_interval, written again only once they moved enough (worth_reporting).

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
  auto schedule = servers.spawn_toyvm_paused("schedule.hand_over", paused, {"-v", "schedule", small}, "schedule.log");
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
