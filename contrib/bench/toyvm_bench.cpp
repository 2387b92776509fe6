// toyvm-bench: the measuring half of contrib/bench/run.py. Each mode prints one JSON object
// on stdout; the driver starts the servers and agents and turns the numbers into a report.
//
//   floor      GET /allocation_candidates + PUT /allocations + one etcd Txn per instance,
//              over kept-alive connections, at a given concurrency (the raw floor and, at high
//              concurrency, Placement's ceiling for the same request mix); with --count 1
//              --start-like-schedule under `exec`, the same requests from one process each
//   members    N users of a project at once, each asking the scheduler service for one
//              instance after another through etcd (a member's `toyvm schedule` without its
//              process), kept-alive connections as the floor's: the batching path's rate
//   exec       runs a command N times at a given concurrency, timing each run
//   active     hands instances straight to one host through etcd and times until ACTIVE
//   providers  creates N resource providers with inventory
//   candidates times GET /allocation_candidates and toyvm's own decision on the answer
//   domain-xml prints the domain an agent on the test driver defines for one of `active`'s
//              instances, its uuid 00000000-0000-4000-8000-000000000000 (for libvirt-floor)
//   live-migration  a tiny guest moved live between two libvirt daemons (live_migration.hpp)

#include "live_migration.hpp"

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "model/candidates.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"
#include "services/member.hpp"
#include "virt/backend.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <thread>

using namespace toyvm;
using namespace boost::asio::experimental::awaitable_operators;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct Options {
  std::string placement = "http://127.0.0.1:8080";
  std::string etcd = "http://127.0.0.1:2379";
  std::string query = "resources=VCPU:1,MEMORY_MB:64";  // run.py's QUERY
  std::string host;
  std::string instance_dir;
  std::string config_file;  // etcd's TLS and user, as toyvm reads them
  std::string project;      // members: theirs
  int count = 100;
  int concurrency = 1;
  int limit = 50;
  bool new_connections = false;  // floor: a Placement connection per instance, as a process has
  bool start_like_schedule = false;  // floor: etcd's channel made alongside the candidates
  bool release_after = false;  // floor: its claims given back once timed, its etcd keys erased
  std::vector<std::string> command;
};

Config make_config(const Options& o) {
  Config config;
  if (!o.config_file.empty()) {
    CommonOverrides file;
    file.config_file = o.config_file;
    config = load_config(file).value();
  }
  config.etcd.endpoints = split_endpoints(o.etcd);
  config.placement.endpoint = o.placement;
  return config;
}

json::array to_json(const std::vector<double>& values) {
  json::array out;
  for (double v : values) out.push_back(v);
  return out;
}

template <class Fn>
void run_loop(Fn make_task) {
  asio::io_context io(1);
  asio::co_spawn(io, make_task(io), asio::detached);
  io.run();
}

// One worker: its own Placement connection, `n` instances one after another.
awaitable<void> floor_worker(asio::io_context& io, const Config& config, std::shared_ptr<EtcdClient> etcd,
                             std::string query, int n, const Options& o, std::vector<double>& latencies,
                             int& failures, std::vector<std::string>& claimed_uuids) {
  std::optional<PlacementClient> placement_client(std::in_place, io.get_executor(), config.placement);
  KeyLayout keys("/toyvm-bench");
  for (int i = 0; i < n; ++i) {
    std::string uuid = new_uuid();
    auto start = Clock::now();
    if (o.new_connections) placement_client.emplace(io.get_executor(), config.placement);
    PlacementClient& placement = *placement_client;
    result<Candidates> candidates = make_error_code(errc::placement_error);
    if (o.start_like_schedule) {
      // As `toyvm schedule` starts: Placement's connection first, then etcd's channel made and
      // connected while the candidates are on their way (here by reading one absent key).
      co_await placement.preconnect();
      auto [answer, absent] = co_await (placement.allocation_candidates(query, Duration{}) && etcd->range(keys.instance(uuid)));
      if (!absent) {
        ++failures;
        continue;
      }
      candidates = std::move(answer);
    } else {
      candidates = co_await placement.allocation_candidates(query, Duration{});
    }
    if (!candidates || candidates->allocation_requests.empty()) {
      ++failures;
      continue;
    }
    ConsumerOwner owner{config.placement.consumer_project, config.placement.consumer_user};
    auto claimed = co_await placement.claim(uuid, candidates->allocation_requests.front(), std::move(owner));
    if (!claimed) {
      ++failures;  // a generation conflict: the floor does not retry
      continue;
    }
    claimed_uuids.push_back(uuid);
    std::vector<EtcdCompare> compare{EtcdCompare::absent(keys.instance(uuid))};
    std::vector<EtcdOp> ops{EtcdOp::put(keys.instance(uuid), "{}")};
    auto txn = co_await etcd->txn(std::move(compare), std::move(ops));
    if (!txn) {
      ++failures;
      continue;
    }
    latencies.push_back(ms_since(start));
  }
}

int run_floor(const Options& o) {
  Config config = make_config(o);
  auto etcd = EtcdClient::create(config.etcd);
  std::string query = parse_placement_query(o.query).value().to_query_string(o.limit);
  std::vector<std::vector<double>> latencies(size_t(o.concurrency));
  std::vector<std::string> claimed;
  int failures = 0;
  auto start = Clock::now();
  run_loop([&](asio::io_context& io) -> awaitable<void> {
    for (int w = 0; w < o.concurrency; ++w) {
      int n = o.count / o.concurrency + (w < o.count % o.concurrency ? 1 : 0);
      asio::co_spawn(io, floor_worker(io, config, etcd, query, n, o, latencies[size_t(w)], failures, claimed),
                     asio::detached);
    }
    co_return;
  });
  double wall = ms_since(start) / 1000;
  if (o.release_after) {
    run_loop([&](asio::io_context& io) -> awaitable<void> {
      PlacementClient placement(io.get_executor(), config.placement);
      for (const std::string& uuid : claimed) co_await placement.release(uuid);
      co_await etcd->erase("/toyvm-bench/", prefix_range_end("/toyvm-bench/"));
    });
  }
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  json::object out{{"latencies_ms", to_json(all)}, {"wall_s", wall}, {"ok", all.size()}, {"failed", failures}};
  std::printf("%s\n", json::serialize(out).c_str());
  // Nothing placed fails the run; as one process per instance under `exec`, that is its count.
  return all.empty() && o.count > 0 ? 1 : 0;
}

// One member: `n` schedules of one instance, one after another, each a request and its reply,
// under the process's lease.
awaitable<void> member_worker(const Config& config, std::shared_ptr<EtcdClient> etcd, const Options& o, int n,
                              int64_t lease, std::vector<double>& latencies, int& failures) {
  KeyLayout keys(config.etcd.prefix);
  ServiceSession session{lease, {}};
  for (int i = 0; i < n; ++i) {
    ProjectRequest request;
    request.user = config.etcd.user;
    request.query = o.query;
    const auto start = Clock::now();
    auto reply = co_await ask_service(*etcd, keys, o.project, std::move(request), std::chrono::seconds(60), &session);
    if (!reply || reply->exit_code != 0 || reply->instances.size() != 1) {
      ++failures;
      continue;
    }
    latencies.push_back(ms_since(start));
  }
}

int run_members(const Options& o) {
  Config config = make_config(o);
  config.etcd.keepalive = true;
  auto etcd = EtcdClient::create(config.etcd);
  std::vector<std::vector<double>> latencies(size_t(o.concurrency));
  int failures = 0;
  const std::chrono::seconds ttl(30);
  Clock::time_point start;
  run_loop([&](asio::io_context&) -> awaitable<void> {
    auto lease = co_await etcd->lease_grant(ttl.count());
    if (!lease) {
      failures = o.count;
      co_return;
    }
    start = Clock::now();
    std::vector<awaitable<void>> members;
    for (int w = 0; w < o.concurrency; ++w) {
      int n = o.count / o.concurrency + (w < o.count % o.concurrency ? 1 : 0);
      members.push_back(member_worker(config, etcd, o, n, *lease, latencies[size_t(w)], failures));
    }
    co_await (run_together(std::move(members)) || keep_session(*etcd, *lease, ttl));
    co_await etcd->lease_revoke(*lease);  // the last requests' keys go with it
  });
  double wall = ms_since(start) / 1000;
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  json::object out{{"latencies_ms", to_json(all)}, {"wall_s", wall}, {"ok", all.size()}, {"failed", failures}};
  std::printf("%s\n", json::serialize(out).c_str());
  return failures == 0 ? 0 : 1;
}

// Runs the command `count` times with `concurrency` runs in flight, timing each.
int run_exec(const Options& o) {
  std::vector<char*> argv;
  std::vector<std::string> args = o.command;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);

  std::map<pid_t, Clock::time_point> running;
  std::vector<double> latencies;
  std::map<int, int> exit_codes;
  int started = 0;
  auto start = Clock::now();
  while (started < o.count || !running.empty()) {
    while (started < o.count && int(running.size()) < o.concurrency) {
      pid_t pid = 0;
      auto t0 = Clock::now();
      if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
        std::fprintf(stderr, "cannot run %s\n", argv[0]);
        return 1;
      }
      running[pid] = t0;
      ++started;
    }
    int status = 0;
    pid_t done = waitpid(-1, &status, 0);
    auto it = running.find(done);
    if (it == running.end()) continue;
    latencies.push_back(ms_since(it->second));
    exit_codes[WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)] += 1;
    running.erase(it);
  }
  double wall = ms_since(start) / 1000;
  json::object codes;
  for (auto& [code, n] : exit_codes) codes[std::to_string(code)] = n;
  json::object out{{"latencies_ms", to_json(latencies)}, {"wall_s", wall}, {"exit_codes", codes}};
  std::printf("%s\n", json::serialize(out).c_str());
  return 0;
}

// Writes work for `host` the way `toyvm schedule` does (one create-only Txn, no Placement
// claim) and times until the agent's ACTIVE arrives through a watch.
int run_active(const Options& o) {
  Config config = make_config(o);
  auto etcd = EtcdClient::create(config.etcd);
  KeyLayout keys;
  std::vector<double> latencies;
  int failures = 0;
  run_loop([&](asio::io_context&) -> awaitable<void> {
    auto watch = etcd->watch(WatchOptions{keys.instances_prefix(), prefix_range_end(keys.instances_prefix()), 0, false});
    co_await watch->next();  // created
    for (int i = 0; i < o.count; ++i) {
      WorkSpec spec;
      spec.uuid = new_uuid();
      // No disk: the test driver's storage pool holds 100 GiB, less than a thousand disks.
      spec.resources = {{"VCPU", 1}, {"MEMORY_MB", 64}};
      InstanceRecord record;
      record.uuid = spec.uuid;
      record.host = o.host;
      std::vector<EtcdCompare> absent{EtcdCompare::absent(keys.work(o.host, spec.uuid))};
      std::vector<EtcdOp> create{EtcdOp::put(keys.work(o.host, spec.uuid), encode(spec)),
                                 EtcdOp::put(keys.instance(spec.uuid), encode(record))};
      auto start = Clock::now();
      auto txn = co_await etcd->txn(std::move(absent), std::move(create));
      if (!txn) {
        ++failures;
        continue;
      }
      // Only builds that end ACTIVE are timed; one that ends in ERROR is counted apart.
      std::optional<InstanceState> final_state;
      while (!final_state) {
        WatchBatch batch = co_await watch->next();
        if (batch.error.code) co_return;
        for (const WatchEvent& event : batch.events) {
          auto r = decode_instance(event.kv.value);
          if (r && r->uuid == spec.uuid && (r->state == InstanceState::active || r->state == InstanceState::error))
            final_state = r->state;
        }
      }
      if (final_state == InstanceState::active) {
        latencies.push_back(ms_since(start));
      } else {
        ++failures;
      }
    }
  });
  json::object out{{"latencies_ms", to_json(latencies)}, {"failed", failures}};
  std::printf("%s\n", json::serialize(out).c_str());
  return 0;
}

int run_providers(const Options& o) {
  Config config = make_config(o);
  int created = 0;
  run_loop([&](asio::io_context& io) -> awaitable<void> {
    PlacementClient placement(io.get_executor(), config.placement);
    Inventory inventory = inventory_from_amounts({{"VCPU", 64}, {"MEMORY_MB", 262144}, {"DISK_GB", 4096}});
    for (int i = 0; i < o.count; ++i) {
      std::string uuid = new_uuid();
      if (!co_await placement.ensure_provider(uuid, "bench-" + uuid)) continue;
      if (co_await placement.set_inventory(uuid, inventory)) ++created;
    }
  });
  std::printf("{\"created\": %d}\n", created);
  return 0;
}

// Puts `count` instances with user data and keys into etcd (addresses 10.x.y.z, the first one
// 127.0.0.1 so a local load generator is a known guest), 64 transactions in flight.
awaitable<void> seed_worker(std::shared_ptr<EtcdClient> etcd, int first, int step, int count, int& written) {
  KeyLayout keys;
  const std::string host = "aaaaaaaa-0000-4000-8000-00000000000b";
  for (int i = first; i < count; i += step) {
    WorkSpec spec;
    spec.uuid = new_uuid();
    spec.name = "guest-" + std::to_string(i);
    spec.user_data = "#cloud-config\nhostname: " + spec.name + "\n";
    spec.keys = {{"bench", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBench bench@toyvm"}};
    InstanceRecord record;
    record.uuid = spec.uuid;
    record.host = host;
    record.state = InstanceState::active;
    record.ip = i == 0 ? "127.0.0.1" : fmt::format("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    std::vector<EtcdOp> ops{EtcdOp::put(keys.work(host, spec.uuid), encode(spec)),
                            EtcdOp::put(keys.instance(spec.uuid), encode(record))};
    std::vector<EtcdCompare> always;
    if (co_await etcd->txn(std::move(always), std::move(ops))) ++written;
  }
}

int run_seed(const Options& o) {
  Config config = make_config(o);
  auto etcd = EtcdClient::create(config.etcd);
  int written = 0;
  run_loop([&](asio::io_context& io) -> awaitable<void> {
    for (int w = 0; w < 64; ++w) asio::co_spawn(io, seed_worker(etcd, w, 64, o.count, written), asio::detached);
    co_return;
  });
  std::printf("{\"written\": %d}\n", written);
  return 0;
}

int run_candidates(const Options& o) {
  Config config = make_config(o);
  std::vector<double> latencies, decisions;
  size_t returned = 0;
  auto query = parse_placement_query(o.query).value();
  run_loop([&](asio::io_context& io) -> awaitable<void> {
    HttpClient http(io.get_executor(), HttpClientOptions{o.placement});
    for (int i = 0; i < o.count; ++i) {
      HttpRequest request{"GET", "/allocation_candidates?" + query.to_query_string(o.limit),
                          {{"OpenStack-API-Version", "placement 1.39"}, {"X-Auth-Token", "admin"}}, {}};
      auto start = Clock::now();
      auto response = co_await http.request(std::move(request));
      latencies.push_back(ms_since(start));
      if (!response || response->status != 200) continue;
      // toyvm's own share: parse the answer and rank it against the live hosts.
      auto decide_start = Clock::now();
      auto candidates = parse_allocation_candidates(response->body);
      std::set<std::string> live;
      if (candidates) {
        for (auto& [rp, summary] : candidates->provider_summaries) live.insert(rp);
        returned = rank_candidates(*candidates, live).size();
      }
      decisions.push_back(ms_since(decide_start));
    }
  });
  json::object out{{"latencies_ms", to_json(latencies)}, {"decision_ms", to_json(decisions)},
                   {"candidates", returned}};
  std::printf("%s\n", json::serialize(out).c_str());
  return 0;
}

int run_domain_xml(const Options& o) {
  DomainSpec spec;
  spec.uuid = "00000000-0000-4000-8000-000000000000";
  spec.name = spec.uuid;
  spec.vcpus = 1;
  spec.memory_mb = 64;
  spec.mac = instance_mac(spec.uuid);
  LibvirtOptions options;  // a `compute` agent's defaults on the test driver
  options.domain_type = "test";
  options.network = "default";
  options.instance_dir = o.instance_dir;
  options.owner = o.host;
  std::fputs(domain_xml(spec, options, "").c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"toyvm-bench: measurements for contrib/bench/run.py"};
  app.require_subcommand(1);
  Options o;
  auto common = [&](CLI::App* sub) {
    sub->add_option("--placement", o.placement);
    sub->add_option("--etcd", o.etcd);
    sub->add_option("--query", o.query);
    sub->add_option("--count", o.count);
    sub->add_option("--concurrency", o.concurrency);
    sub->add_option("--limit", o.limit, "0: no limit");
    sub->add_option("--config", o.config_file, "toyvm's configuration file, for etcd's TLS and user");
  };
  auto* floor = app.add_subcommand("floor", "raw GET candidates + PUT allocations + etcd Txn");
  floor->add_flag("--new-connections", o.new_connections, "a new Placement connection per instance");
  floor->add_flag("--start-like-schedule", o.start_like_schedule,
                  "open Placement's connection first, make etcd's channel alongside the candidates");
  floor->add_flag("--release-after", o.release_after, "give the claims back once timed");
  auto* members = app.add_subcommand("members", "users asking the scheduler service for one instance each");
  members->add_option("--project", o.project, "the members' project")->required();
  auto* exec = app.add_subcommand("exec", "time a command");
  auto* active = app.add_subcommand("active", "time work -> ACTIVE on one host");
  auto* providers = app.add_subcommand("providers", "create providers");
  auto* candidates = app.add_subcommand("candidates", "time candidates and toyvm's decision");
  auto* seed = app.add_subcommand("seed", "put instances for the metadata service into etcd");
  auto* domain = app.add_subcommand("domain-xml", "print an agent's domain for libvirt-floor");
  domain->add_option("--owner", o.host, "the agent's provider uuid")->required();
  domain->add_option("--instance-dir", o.instance_dir, "the agent's instance directory")->required();
  LiveMigrationOptions migration;
  auto* live = app.add_subcommand("live-migration", "move a tiny guest live between two libvirt daemons");
  live->add_option("--from", migration.from, "the first daemon's URI");
  live->add_option("--to", migration.to, "the second daemon's URI")->required();
  live->add_option("--back", migration.back, "the first daemon's URI as the second reaches it");
  live->add_option("--image-dir", migration.image_dir, "kernel, initrd, cmdline, disk.raw")->required();
  live->add_option("--dir", migration.dir, "where the two instance dirs go")->required();
  live->add_option("--rounds", migration.rounds, "moves, alternating direction");
  live->add_flag("--virsh", migration.virsh, "move with `virsh migrate` instead: the floor");
  for (auto* sub : {floor, members, exec, active, providers, candidates, seed}) common(sub);
  active->add_option("--host", o.host)->required();
  exec->add_option("command", o.command)->required();
  CLI11_PARSE(app, argc, argv);
  int code = 1;
  if (*floor) code = run_floor(o);
  if (*members) code = run_members(o);
  if (*exec) code = run_exec(o);
  if (*active) code = run_active(o);
  if (*providers) code = run_providers(o);
  if (*candidates) code = run_candidates(o);
  if (*seed) code = run_seed(o);
  if (*domain) code = run_domain_xml(o);
  if (*live) code = run_live_migration(migration);
  std::fflush(stdout);
  std::_Exit(code);
}
