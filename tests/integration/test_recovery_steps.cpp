// Crashes and lost answers in the middle of a step: hand-overs whose answer etcd lost, builds
// whose work left or whose lease was lost, watches lost, steps that throw, against a real etcd
// and Placement.

#include "harness.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"

#include "catch_result.hpp"

#include <fmt/format.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

using namespace toyvm;
using namespace toyvm::test;
namespace fs = std::filesystem;

namespace {

const std::string small = "resources=VCPU:1,DISK_GB:1,MEMORY_MB:64";
const std::string roomy = "VCPU:1000,DISK_GB:10000,MEMORY_MB:100000";

// An agent "c1" whose builds wait at their start while the file `paused` (made here) exists.
std::unique_ptr<Process> start_compute_paused_at_build(Servers& servers, const std::string& paused, std::string* rp,
                                                       const std::string& compute_toml = "") {
  std::ofstream(paused) << "";
  ScopedEnv failpoints("TOYVM_FAILPOINTS", "build.begin=pause(" + paused + ")");
  return servers.start_compute("c1", roomy, rp, {}, compute_toml);
}

// A Python server started from `script`, once it accepts connections on `port`.
std::unique_ptr<Process> serve_python(const std::string& script, uint16_t port, const std::string& log) {
  auto process = std::make_unique<Process>(std::vector<std::string>{"/usr/bin/python3", "-c", script}, log);
  if (!wait_for([&] { return accepts_connections(port); }, 20))
    throw std::runtime_error("proxy did not start: " + process->output());
  return process;
}

// Placement behind a proxy that holds every PUT /allocations while `hold` exists, and every
// GET /allocation_candidates while `hold_looks` does (a slow Placement, staged), and logs
// "holding" when it starts holding one.
struct HoldingProxy {
  uint16_t port = free_port();
  std::string hold, hold_looks;
  std::unique_ptr<Process> process;

  HoldingProxy(const std::string& target, const std::string& dir) : hold(dir + "/hold"), hold_looks(dir + "/hold-looks") {
    std::string script = fmt::format(
        "import http.server, os, sys, time, urllib.request, urllib.error\n"
        "class Proxy(http.server.BaseHTTPRequestHandler):\n"
        "    protocol_version = 'HTTP/1.1'\n"
        "    def forward(self):\n"
        "        body = self.rfile.read(int(self.headers.get('Content-Length') or 0))\n"
        "        if self.command == 'PUT' and self.path.startswith('/allocations/') and os.path.exists('{hold}'):\n"
        "            print('holding', self.path, flush=True)\n"
        "            while os.path.exists('{hold}'): time.sleep(0.02)\n"
        "        if self.command == 'GET' and self.path.startswith('/allocation_candidates') and os.path.exists('{hold_looks}'):\n"
        "            print('holding', self.path, flush=True)\n"
        "            while os.path.exists('{hold_looks}'): time.sleep(0.02)\n"
        "        headers = {{k: v for k, v in self.headers.items() if k.lower() not in ('host', 'content-length', 'connection')}}\n"
        "        request = urllib.request.Request('{target}' + self.path, data=body or None, method=self.command, headers=headers)\n"
        "        try:\n"
        "            answer = urllib.request.urlopen(request, timeout=30)\n"
        "            status, data, answer_headers = answer.status, answer.read(), answer.headers\n"
        "        except urllib.error.HTTPError as e:\n"
        "            status, data, answer_headers = e.code, e.read(), e.headers\n"
        "        self.send_response(status)\n"
        "        for k, v in answer_headers.items():\n"
        "            if k.lower() not in ('transfer-encoding', 'connection', 'content-length'): self.send_header(k, v)\n"
        "        self.send_header('Content-Length', str(len(data)))\n"
        "        self.end_headers()\n"
        "        self.wfile.write(data)\n"
        "    do_GET = do_PUT = do_POST = do_DELETE = forward\n"
        "    def log_message(self, *args): pass\n"
        "http.server.ThreadingHTTPServer(('127.0.0.1', {port}), Proxy).serve_forever()\n",
        fmt::arg("hold", hold), fmt::arg("hold_looks", hold_looks), fmt::arg("target", target), fmt::arg("port", port));
    process = serve_python(script, port, dir + "/proxy.log");
  }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port); }
};

// etcd behind a TCP proxy that, while `mute` exists, passes what clients send and keeps what
// etcd answers until it is gone: a request that etcd carried out but whose answer was lost.
struct MutingProxy {
  uint16_t port = free_port();
  std::string mute;
  std::unique_ptr<Process> process;

  MutingProxy(uint16_t target, const std::string& dir) : mute(dir + "/mute") {
    std::string script = fmt::format(
        "import asyncio, os\n"
        "async def answers(reader, writer):\n"
        "    while data := await reader.read(65536):\n"
        "        while os.path.exists('{mute}'): await asyncio.sleep(0.02)\n"
        "        writer.write(data)\n"
        "        await writer.drain()\n"
        "    writer.close()\n"
        "async def requests(reader, writer):\n"
        "    while data := await reader.read(65536):\n"
        "        writer.write(data)\n"
        "        await writer.drain()\n"
        "    writer.close()\n"
        "async def serve(client_reader, client_writer):\n"
        "    etcd_reader, etcd_writer = await asyncio.open_connection('127.0.0.1', {target})\n"
        "    await asyncio.gather(requests(client_reader, etcd_writer), answers(etcd_reader, client_writer),\n"
        "                         return_exceptions=True)\n"
        "async def main():\n"
        "    server = await asyncio.start_server(serve, '127.0.0.1', {port})\n"
        "    await server.serve_forever()\n"
        "asyncio.run(main())\n",
        fmt::arg("mute", mute), fmt::arg("target", target), fmt::arg("port", port));
    process = serve_python(script, port, dir + "/etcd-proxy.log");
  }
  std::string endpoint() const { return fmt::format("http://127.0.0.1:{}", port); }
};

}  // namespace

TEST_CASE("a hand-over whose answer etcd lost is read back: the schedule keeps its claim and succeeds", "[recovery]") {
  Servers servers;
  HoldingProxy placement(servers.config.placement.endpoint, servers.dir());
  const std::string etcd = servers.config.etcd.endpoints.front();
  MutingProxy proxy(uint16_t(std::stoi(etcd.substr(etcd.rfind(':') + 1))), servers.dir());
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  std::string config = servers.dir() + "/short-etcd-timeout.toml";
  std::ofstream(config) << "[etcd]\ntimeout = 2\n";

  // The claim waits in the proxy; etcd's answers are cut before it goes on to hand over.
  std::ofstream(placement.hold) << "";
  auto schedule = std::make_unique<Process>(
      std::vector<std::string>{toyvm_binary(), "-v", "--config", config, "--etcd", proxy.endpoint(), "--placement",
                               placement.url(), "schedule", small},
      servers.dir() + "/schedule.log");
  REQUIRE(wait_for([&] { return placement.process->output().find("holding /allocations/") != std::string::npos; }, 30));
  std::ofstream(proxy.mute) << "";
  std::remove(placement.hold.c_str());
  // The transaction reached etcd and committed; its answer did not come back in time.
  REQUIRE(wait_for([&] { return schedule->output().find("Deadline Exceeded") != std::string::npos; }, 30));
  std::remove(proxy.mute.c_str());

  int status = schedule->wait(60);
  INFO(schedule->output() << compute->output());
  CHECK(status == 0);
  auto [target, uuid] = parse_notified(schedule->output());
  REQUIRE(target == rp);
  wait_for_state(servers, uuid, "ACTIVE");
  CHECK(servers.allocations(uuid).count(rp) == 1);
  CHECK(servers.toyvm({"audit"}).exit_code == 0);
}

TEST_CASE("a batch's look waits for a busy Placement as long as its claim may; a single schedule's gives up",
          "[recovery]") {
  Servers servers;
  HoldingProxy placement(servers.config.placement.endpoint, servers.dir());
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  std::string config = servers.dir() + "/short-placement-timeout.toml";
  std::ofstream(config) << "[placement]\ntimeout = 1\n";
  auto holding = [&] { return count_of(placement.process->output(), "holding /allocation_candidates"); };
  auto schedule = [&](std::vector<std::string> args, const std::string& log) {
    std::vector<std::string> command{toyvm_binary(), "--config", config, "--etcd",
                                     fmt::format("{}", fmt::join(servers.config.etcd.endpoints, ",")),
                                     "--placement", placement.url(), "schedule", small};
    command.insert(command.end(), args.begin(), args.end());
    return std::make_unique<Process>(command, servers.dir() + "/" + log);
  };

  // Placement answers no look for now: a batch of 40 (8 s to wait, 200 ms an instance)
  // asks first, then a single schedule (1 s).
  std::ofstream(placement.hold_looks) << "";
  auto batch = schedule({"--count", "40"}, "batch.log");
  REQUIRE(wait_for([&] { return holding() == 1; }, 30));
  auto single = schedule({}, "single.log");
  // The single one gives up while the batch, asking since before it, still waits.
  CHECK(single->wait(30) != 0);
  CHECK_THAT(single->output(), Catch::Contains("cannot reach Placement"));
  CHECK(batch->running());
  fs::remove(placement.hold_looks);
  CHECK(batch->wait(60) == 0);
  CHECK(count_of(batch->output(), "NOTIFIED TARGET") == 40);
  CHECK(servers.usages(rp)["VCPU"] == 40);
}

TEST_CASE("a destroy that lands while a failed build moves is never undone", "[recovery]") {
  Servers servers;
  HoldingProxy proxy(servers.config.placement.endpoint, servers.dir());
  // Host A fails every build (libvirt refuses the domain type); B is healthy, and a little
  // fuller, so that spreading puts the instance on A first.
  std::string healthy;
  auto b = servers.start_compute("b", "VCPU:10,DISK_GB:100,MEMORY_MB:10000", &healthy, {"--trait", "CUSTOM_B"});
  REQUIRE(servers.toyvm({"schedule", small + "&required=CUSTOM_B", "--wait"}).exit_code == 0);
  std::string broken_config = servers.dir() + "/broken.toml";
  std::ofstream(broken_config) << "[compute]\ndomain_type = \"bogus\"\n";
  auto a = std::make_unique<Process>(
      std::vector<std::string>{toyvm_binary(), "--etcd", servers.config.etcd.endpoints.front(), "--placement",
                               proxy.url(), "--config", broken_config, "compute", "--state-dir", servers.dir() + "/a",
                               "--libvirt-uri", "test:///default", "--inventory", "VCPU:10,DISK_GB:100,MEMORY_MB:10000",
                               "--name", "a"},
      servers.dir() + "/a.log");
  REQUIRE(wait_for([&] { return read_file(servers.dir() + "/a/provider_uuid").size() >= 36; }, 20));
  const std::string broken = read_file(servers.dir() + "/a/provider_uuid").substr(0, 36);
  REQUIRE(wait_for([&] { return !servers.etcd_prefix(KeyLayout().host(broken)).empty(); }, 20));

  std::ofstream(proxy.hold) << "";
  auto scheduled = servers.toyvm({"schedule", small});
  REQUIRE(scheduled.exit_code == 0);
  auto [target, uuid] = parse_notified(scheduled.out);
  REQUIRE(target == broken);
  // A's build failed and its move to B waits on Placement: now the user destroys it.
  REQUIRE(wait_for([&] { return proxy.process->output().find("holding /allocations/" + uuid) != std::string::npos; },
                   30));
  REQUIRE(servers.toyvm({"destroy", uuid, "--no-wait"}).exit_code == 0);
  std::remove(proxy.hold.c_str());

  INFO(a->output() << b->output());
  CHECK(wait_for([&] { return servers.etcd_prefix(KeyLayout().instance(uuid)).empty(); }, 30));
  CHECK(servers.etcd_prefix(KeyLayout().work(healthy, uuid)).empty());
  CHECK(servers.etcd_prefix(KeyLayout().work(broken, uuid)).empty());
  CHECK(servers.allocations(uuid).empty());
  CHECK(b->output().find("instance " + uuid + ": building") == std::string::npos);
  CHECK(servers.toyvm({"audit"}).exit_code == 0);
}

// Hole 6: the feed is late (paused on purpose) when the work leaves this host, so only the
// guard on the agent's own writes can tell it that the build it is about to make is moot.
TEST_CASE("a build whose work left the host before the feed said so stops at its first write", "[recovery]") {
  Servers servers;
  const std::string build_paused = servers.dir() + "/build-paused", feed_paused = servers.dir() + "/feed-paused";
  std::ofstream(build_paused) << "";
  std::string a, b;
  std::unique_ptr<Process> compute_a;
  {
    ScopedEnv failpoints("TOYVM_FAILPOINTS",
                         "build.begin=pause(" + build_paused + ");feed.batch=pause(" + feed_paused + ")");
    compute_a = servers.start_compute("a", roomy, &a, {"--trait", "CUSTOM_A"});
  }
  auto compute_b = servers.start_compute("b", roomy, &b);
  auto scheduled = servers.toyvm({"schedule", small + "&required=CUSTOM_A"});
  REQUIRE(scheduled.exit_code == 0);
  auto [target, uuid] = parse_notified(scheduled.out);
  REQUIRE(target == a);
  REQUIRE(wait_for([&] { return compute_a->output().find("failpoint build.begin: paused") != std::string::npos; }, 30));

  // The work moves to B, as a move does; A's feed holds the news back.
  std::ofstream(feed_paused) << "";
  auto work = servers.etcd_prefix(KeyLayout().work(a, uuid));
  REQUIRE(work.size() == 1);
  servers.etcd_erase(KeyLayout().work(a, uuid));
  servers.etcd_put(KeyLayout().work(b, uuid), work.front().value);
  REQUIRE(wait_for([&] { return compute_a->output().find("failpoint feed.batch: paused") != std::string::npos; }, 30));
  std::remove(build_paused.c_str());

  INFO(compute_a->output() << compute_b->output());
  CHECK(wait_for([&] { return compute_a->output().find("instance " + uuid + ": its work is no longer on this host") !=
                              std::string::npos; },
                 30));
  // Its domain's key is published apart from the build, as libvirt tells of the start: it is
  // gone once the domain is.
  CHECK(wait_for([&] { return servers.etcd_prefix(KeyLayout().domain(a, uuid)).empty(); }, 30));
  CHECK(compute_a->output().find("instance " + uuid + ": active") == std::string::npos);

  std::remove(feed_paused.c_str());
  auto record = wait_for_record(servers, uuid, [&](const InstanceRecord& r) {
    return r.state == InstanceState::active && r.host == b;
  });
  CHECK(record.has_value());
  CHECK(compute_a->output().find("instance " + uuid + ": active") == std::string::npos);
}

TEST_CASE("a build whose agent lost its lease unnoticed ends ACTIVE, its domain published under a new lease",
          "[recovery]") {
  Servers servers;
  const std::string build_paused = servers.dir() + "/build-paused";
  std::string rp;
  // A keep-alive every 30 s: the build records ACTIVE before the agent sees its lease gone.
  auto compute = start_compute_paused_at_build(servers, build_paused, &rp, "lease_ttl = 60\n");
  auto scheduled = servers.toyvm({"schedule", small});
  REQUIRE(scheduled.exit_code == 0);
  const std::string uuid = parse_notified(scheduled.out).second;
  REQUIRE(wait_for([&] { return compute->output().find("failpoint build.begin: paused") != std::string::npos; }, 30));
  // The lease goes behind the agent's back, and its host record with it.
  auto hosts = servers.etcd_prefix(KeyLayout().host(rp));
  REQUIRE(hosts.size() == 1);
  auto etcd = EtcdClient::create(servers.config.etcd);
  const int64_t lease = hosts.front().lease;
  REQUIRE(run_sync<result<void>>([&](asio::io_context&) { return etcd->lease_revoke(lease); }));
  std::remove(build_paused.c_str());

  // etcd refuses the domain's key under the gone lease, and ACTIVE with it; the next round
  // records ACTIVE alone.
  CHECK_THAT(wait_for_state(servers, uuid, "ACTIVE", 10), Catch::Contains("ACTIVE"));
  INFO(compute->output());
  // Once the agent sees the lease gone (at its next keep-alive) it announces itself again, within
  // one more interval, and publishes its domain.
  CHECK(wait_for([&] { return published_domains(servers, rp) == 1; }, 70));
  CHECK(wait_for([&] { return servers.toyvm({"audit"}).exit_code == 0; }, 10));
}

TEST_CASE("schedule --wait rides over etcd going away and coming back while it waits", "[recovery]") {
  Servers servers;
  const std::string build_paused = servers.dir() + "/build-paused";
  std::string rp;
  auto compute = start_compute_paused_at_build(servers, build_paused, &rp);
  auto waiting = servers.spawn_toyvm({"schedule", small, "--wait"}, "wait.log");
  REQUIRE(wait_for([&] { return compute->output().find("failpoint build.begin: paused") != std::string::npos; }, 30));
  REQUIRE(wait_for([&] { return waiting->output().find("INSTANCE") != std::string::npos; }, 30));
  servers.stop_etcd();
  servers.start_etcd_again();
  std::remove(build_paused.c_str());
  INFO(waiting->output() << compute->output());
  CHECK(waiting->wait(60) == 0);
  const std::string uuid = parse_notified(waiting->output()).second;
  CHECK_THAT(waiting->output(), Catch::Contains("INSTANCE " + uuid + " ACTIVE"));
}

// etcd far behind under a burst of writes answers late, as one away answers never: a destroy's
// request is asked again until etcd answers, not given up at the first call's timeout.
TEST_CASE("a destroy that meets etcd away for a moment asks again and is done", "[recovery]") {
  Servers servers;
  std::string rp;
  auto compute = servers.start_compute("c1", roomy, &rp);
  auto scheduled = servers.toyvm({"schedule", small, "--wait"});
  REQUIRE(scheduled.exit_code == 0);
  const std::string uuid = parse_notified(scheduled.out).second;
  const std::string paused = servers.dir() + "/destroy-paused";
  auto destroying = servers.spawn_toyvm_paused("destroy.asking", paused, {"destroy", uuid}, "destroy.log");
  // The record read, etcd goes away; the request is asked while it is away, then again.
  servers.stop_etcd();
  fs::remove(paused);
  REQUIRE(wait_for([&] { return destroying->output().find("asking again") != std::string::npos ||
                                !destroying->running(); }, 20));
  servers.start_etcd_again();
  INFO(destroying->output() << compute->output());
  CHECK(destroying->wait(60) == 0);
  CHECK_THAT(destroying->output(), Catch::Contains("asking again"));
  CHECK_THAT(destroying->output(), Catch::Contains("DESTROYED INSTANCE " + uuid));
  CHECK(wait_for([&] { return servers.etcd_prefix(KeyLayout().instance(uuid)).empty(); }, 30));
  CHECK(servers.allocations(uuid).empty());

  // Away before the destroy reads the record: the read is asked again as well.
  auto second = servers.toyvm({"schedule", small, "--wait"});
  REQUIRE(second.exit_code == 0);
  const std::string other = parse_notified(second.out).second;
  servers.stop_etcd();
  auto reading = servers.spawn_toyvm({"destroy", other}, "destroy-other.log");
  REQUIRE(wait_for([&] { return reading->output().find("asking again") != std::string::npos || !reading->running(); },
                   20));
  servers.start_etcd_again();
  INFO(reading->output());
  CHECK(reading->wait(60) == 0);
  CHECK_THAT(reading->output(), Catch::Contains("DESTROYED INSTANCE " + other));
}

TEST_CASE("following a key tells what happened while its watch was lost or its history compacted", "[recovery]") {
  Servers servers;
  auto etcd = EtcdClient::create(servers.config.etcd);
  const std::string key = "/toyvm-test/followed";
  std::vector<std::string> seen;  // "put <value>" or "erase"
  auto follow = [&](int64_t from, std::chrono::milliseconds timeout) {
    seen.clear();
    return run_sync<result<bool>>([&](asio::io_context&) -> awaitable<result<bool>> {
      // (Named outside co_await: GCC 12 miscompiles a capturing lambda inside it.)
      std::function<bool(const WatchEvent&)> record = [&](const WatchEvent& event) {
        seen.push_back(event.type == WatchEvent::Type::erase ? "erase" : "put " + event.kv.value);
        return event.type == WatchEvent::Type::erase || event.kv.value == "three";
      };
      co_return co_await follow_key(*etcd, key, from, timeout, std::move(record));
    });
  };
  servers.etcd_put(key, "one");
  const int64_t first = servers.etcd_prefix(key).front().mod_revision;
  servers.etcd_put(key, "two");
  servers.etcd_put(key, "three");
  servers.etcd_put("/toyvm-test/other", "x");
  // Nothing compacted yet: every change after the first is seen, in order.
  CHECK(follow(first + 1, std::chrono::seconds(10)).value());
  CHECK(seen == std::vector<std::string>{"put two", "put three"});
  // The history from there on is gone: the key is read again and its value is what is told.
  servers.etcd_compact();
  CHECK(follow(first + 1, std::chrono::seconds(10)).value());
  CHECK(seen == std::vector<std::string>{"put three"});
  // Deleted meanwhile, and compacted: the deletion is told.
  servers.etcd_erase(key);
  servers.etcd_put("/toyvm-test/other", "y");
  servers.etcd_compact();
  CHECK(follow(first + 1, std::chrono::seconds(10)).value());
  CHECK(seen == std::vector<std::string>{"erase"});
  // Nothing happens: the time runs out.
  servers.etcd_put(key, "four");
  const int64_t now = servers.etcd_prefix(key).front().mod_revision;
  CHECK_FALSE(follow(now + 1, std::chrono::milliseconds(300)).value());
  CHECK(seen.empty());
  // etcd away the whole time: what it said is returned, not a timeout.
  servers.stop_etcd();
  auto away = follow(now + 1, std::chrono::milliseconds(1500));
  CHECK_FALSE(away.has_value());
}

namespace {
// One etcd member's metrics (nothing: it did not answer).
awaitable<std::optional<std::string>> member_metrics(std::string endpoint) {
  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  const HttpClientOptions options{std::move(endpoint), std::chrono::milliseconds(2000)};
  HttpClient http(executor, options);
  HttpRequest request{"GET", "/metrics", {}, {}};
  auto answer = co_await http.request(std::move(request));
  if (!answer) co_return std::nullopt;
  co_return std::move(answer->body);
}

// The metrics of the member the client reaches first ("" when it does not answer).
std::string first_member_metrics(const Servers& servers) {
  return run_sync<std::string>([&](asio::io_context&) -> awaitable<std::string> {
    auto metrics = co_await member_metrics(servers.config.etcd.endpoints.front());
    co_return metrics.value_or("");
  });
}
}  // namespace

// etcd renews one stream's leases one after another, each once its leader has applied what it
// committed: the leases of one process (ten thousand simulated hosts) ride several streams.
TEST_CASE("a client's many leases are kept alive on several etcd streams", "[recovery]") {
  Servers servers;
  auto etcd = EtcdClient::create(servers.config.etcd);
  constexpr int leases = 64;
  const int alive = run_sync<int>([&](asio::io_context&) -> awaitable<int> {
    std::vector<std::unique_ptr<EtcdLeaseKeeper>> keepers;
    for (int i = 0; i < leases; ++i) {
      auto lease = co_await etcd->lease_grant(30);
      if (!lease) co_return -1;
      keepers.push_back(etcd->keep_alive(*lease));
    }
    int renewed = 0;
    for (auto& keeper : keepers) {
      auto ttl = co_await keeper->ping();
      if (ttl && *ttl > 0) ++renewed;
    }
    co_return renewed;
  });
  CHECK(alive == leases);
  // etcd's own count of the keep-alive streams it was asked for.
  const std::string metrics = first_member_metrics(servers);
  std::smatch started;
  REQUIRE(std::regex_search(metrics, started,
                            std::regex(R"(grpc_server_started_total\{grpc_method="LeaseKeepAlive"[^}]*\} (\d+))")));
  const int streams = std::stoi(started[1]);
  CHECK(streams > 1);
  CHECK(streams <= leases);
}

namespace {
// The lease renewals each etcd member took from clients, from its metrics (-1: it did not answer).
awaitable<std::vector<long>> renewals_taken(const Servers& servers) {
  std::vector<long> taken;
  const std::regex line(R"(grpc_server_msg_received_total\{grpc_method="LeaseKeepAlive"[^}]*\} (\d+))");
  for (const std::string& endpoint : servers.config.etcd.endpoints) {
    auto metrics = co_await member_metrics(endpoint);
    std::smatch count;
    taken.push_back(!metrics ? -1 : std::regex_search(*metrics, count, line) ? std::stol(count[1]) : 0);
  }
  co_return taken;
}

// Renews `keeper`'s lease every 100 ms until `renewals` in a row reached member `leader` of
// etcd and no other member, or `seconds` pass. false: the lease lapsed, or the time ran out.
awaitable<bool> renewed_only_through(const Servers& servers, EtcdLeaseKeeper& keeper, int leader, int renewals,
                                     int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<long> before = co_await renewals_taken(servers);
    bool lapsed = false;
    for (int i = 0; i < renewals; ++i) {
      auto ttl = co_await keeper.ping();
      if (ttl && *ttl <= 0) lapsed = true;
      timer.expires_after(std::chrono::milliseconds(100));
      co_await timer.async_wait(use_awaitable);
    }
    if (lapsed) co_return false;
    std::vector<long> after = co_await renewals_taken(servers);
    bool only_leader = after[size_t(leader)] - before[size_t(leader)] >= renewals;
    for (size_t member = 0; member < after.size(); ++member)
      if (int(member) != leader && after[member] != before[member]) only_leader = false;
    if (only_leader) co_return true;
  }
  co_return false;
}
}  // namespace

// A follower sends each renewal it takes on to the leader as a request of its own: a
// long-lived client renews through the leader, and after an election through the new one.
TEST_CASE("a long-lived client renews its leases through etcd's leader, and then through the next", "[recovery]") {
  Servers servers(ServersOptions{.etcd_members = 3});
  EtcdConfig config = servers.config.etcd;
  config.keepalive = true;
  auto etcd = EtcdClient::create(config);
  const int leader = servers.etcd_leader();
  int next = -1;
  bool through_leader = false, through_next = false;
  run_sync<bool>([&](asio::io_context&) -> awaitable<bool> {
    auto lease = co_await etcd->lease_grant(20);
    if (!lease) co_return false;
    auto keeper = etcd->keep_alive(*lease);
    through_leader = co_await renewed_only_through(servers, *keeper, leader, 10, 30);
    // The leader goes: its renewals fail, go through the members the client reaches, then
    // through the leader elected, and the lease lives on.
    servers.kill_etcd_leader();
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
         next < 0 && std::chrono::steady_clock::now() < deadline;) {
      try {
        next = servers.etcd_leader();
      } catch (const std::runtime_error&) {  // none elected yet
      }
    }
    if (next < 0) co_return false;
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
         !through_next && std::chrono::steady_clock::now() < deadline;) {
      auto ttl = co_await keeper->ping();
      if (!ttl) {  // the stream to the old leader ended: a keeper anew, as a host's presence makes one
        keeper = etcd->keep_alive(*lease);
        continue;
      }
      if (*ttl <= 0) co_return false;  // lapsed
      through_next = co_await renewed_only_through(servers, *keeper, next, 10, 5);
    }
    co_return true;
  });
  CHECK(through_leader);
  REQUIRE(next >= 0);
  CHECK(next != leader);
  CHECK(through_next);
}

namespace {
// etcd's own count of the transactions it answered, from its metrics.
int etcd_txns_answered(Servers& servers) {
  const std::string metrics = first_member_metrics(servers);
  int total = 0;
  const std::regex line(R"(grpc_server_handled_total\{[^}]*grpc_method="Txn"[^}]*\} (\d+))");
  for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), line); it != std::sregex_iterator(); ++it)
    total += std::stoi((*it)[1]);
  return total;
}

// Runs each(0) ... each(n - 1) at once on one event loop, until all are done.
void at_once(size_t n, const std::function<awaitable<void>(size_t)>& each) {
  run_sync<int>([&](asio::io_context&) -> awaitable<int> {
    std::vector<awaitable<void>> all;
    for (size_t i = 0; i < n; ++i) all.push_back(each(i));
    co_await run_together(std::move(all));
    co_return 0;
  });
}
}  // namespace

// A process's transactions asked for at once go to etcd together, as nested transactions,
// each still decided by its own compares, and one refused does not take the others with it.
TEST_CASE("transactions asked for at once go together, each decided alone", "[recovery]") {
  Servers servers;
  auto etcd = EtcdClient::create(servers.config.etcd);
  constexpr int distinct = 48, races = 8;
  // Each creates its key where none exists; two of each race ask for the same key.
  std::vector<std::string> keys;
  for (int i = 0; i < distinct; ++i) keys.push_back(fmt::format("/test/together/{}", i));
  for (int i = 0; i < races; ++i) {
    const std::string key = fmt::format("/test/race/{}", i);
    keys.insert(keys.end(), {key, key});
  }
  const int before = etcd_txns_answered(servers);
  std::vector<int> outcome(keys.size(), -1);  // 1 made, 0 refused by its compare, -1 an error
  auto create = [&](size_t i) -> awaitable<void> {
    std::vector<EtcdCompare> absent{EtcdCompare::absent(keys[i])};
    std::vector<EtcdOp> put{EtcdOp::put(keys[i], std::to_string(i))};
    auto made = co_await etcd->txn(std::move(absent), std::move(put));
    outcome[i] = made ? int(made->succeeded) : -1;
  };
  at_once(keys.size(), create);
  for (int i = 0; i < distinct; ++i) CHECK(outcome[size_t(i)] == 1);
  for (int i = 0; i < races; ++i) {
    const size_t first = size_t(distinct + 2 * i);
    CHECK(outcome[first] + outcome[first + 1] == 1);  // exactly one of the two made it
    const auto stored = servers.etcd_prefix(keys[first]);
    REQUIRE(stored.size() == 1);
    CHECK(stored.front().value == std::to_string(outcome[first] == 1 ? first : first + 1));
  }
  CHECK(servers.etcd_prefix("/test/together/").size() == size_t(distinct));
  // Far fewer requests than transactions reached etcd.
  const int requests = etcd_txns_answered(servers) - before;
  INFO(requests << " requests for " << keys.size() << " transactions");
  CHECK(requests < int(keys.size()) / 2);

  // Reads asked for at once are one read of them all, each answered with its own keys and
  // the revision read at.
  const int64_t now = servers.etcd_prefix("/test/together/0").front().mod_revision;
  std::vector<std::optional<RangeResult>> read(keys.size());
  auto get = [&](size_t i) -> awaitable<void> {
    auto found = co_await etcd->range(keys[i]);
    if (found) read[i] = std::move(*found);
  };
  const int before_reads = etcd_txns_answered(servers);
  at_once(keys.size(), get);
  for (size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(read[i]);
    REQUIRE(read[i]->kvs.size() == 1);
    CHECK(read[i]->kvs.front().key == keys[i]);
    CHECK(read[i]->revision >= now);
  }
  CHECK(etcd_txns_answered(servers) - before_reads < int(keys.size()) / 2);

  // A write etcd refuses (under a lease that does not exist) fails alone.
  std::vector<int> leased(8, -1);
  auto put = [&](size_t i) -> awaitable<void> {
    std::vector<EtcdCompare> none;
    std::vector<EtcdOp> op{EtcdOp::put(fmt::format("/test/leased/{}", i), "x", i == 3 ? 0x7a11ed : 0)};
    auto made = co_await etcd->txn(std::move(none), std::move(op));
    leased[i] = made ? int(made->succeeded) : -1;
  };
  at_once(leased.size(), put);
  CHECK(leased == std::vector<int>{1, 1, 1, -1, 1, 1, 1, 1});
  CHECK(servers.etcd_prefix("/test/leased/").size() == 7);
}

// Hole 7: a step that throws is a failed step, retried; the instance is not stuck.
TEST_CASE("a reconcile step that throws is retried and the instance still becomes ACTIVE", "[recovery]") {
  Servers servers;
  std::string rp;
  std::unique_ptr<Process> compute;
  {
    ScopedEnv failpoints("TOYVM_FAILPOINTS", "reconcile.step=1*throw");
    compute = servers.start_compute("c1", roomy, &rp);
  }
  auto scheduled = servers.toyvm({"schedule", small, "--wait"});
  INFO(scheduled.err << compute->output());
  CHECK(scheduled.exit_code == 0);
  CHECK_THAT(compute->output(), Catch::Contains("failpoint reconcile.step: throwing"));
  CHECK_THAT(compute->output(), Catch::Contains("will retry"));
}

// A host whose disk is full fails the build, not the image: the instance may try other hosts
// (launch_failure), and ends no_valid_host when none can (libvirt's test driver has a storage
// pool of 100 GiB, below what this host offers Placement).
TEST_CASE("a host without room for the disk is a launch failure, not the image's", "[recovery]") {
  Servers servers;
  std::string rp;
  auto a = servers.start_compute("a", "VCPU:10,DISK_GB:1000,MEMORY_MB:10000", &rp);
  auto scheduled = servers.toyvm({"schedule", "resources=VCPU:1,DISK_GB:150,MEMORY_MB:64", "--wait"});
  INFO(scheduled.out << scheduled.err << a->output());
  CHECK(scheduled.exit_code == 5);
  auto [target, uuid] = parse_notified(scheduled.out);
  auto record = wait_for_record(servers, uuid, [](const InstanceRecord& r) { return r.state == InstanceState::error; });
  REQUIRE(record.has_value());
  CHECK(record->error_code == "no_valid_host");
  CHECK_THAT(record->error_message, Catch::Contains("launch_failure: cannot make the disk overlay"));
  CHECK(servers.allocations(uuid).empty());
}
