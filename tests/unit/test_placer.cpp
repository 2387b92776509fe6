// The placer against Placement's HTTP face and etcd in memory: first-fit claims through
// conflicts, and the one move engine's outcomes, without servers.
#include "fakes/fake_etcd.hpp"
#include "fakes/fake_placement.hpp"

#include "services/placer.hpp"

#include "catch_result.hpp"

#include <boost/asio/executor_work_guard.hpp>

using namespace toyvm;
using namespace std::chrono_literals;
using fakes::FakeEtcd;
using fakes::FakePlacement;
using fakes::PlacementAnswer;
using fakes::PlacementRequest;

namespace {

const std::string host_a = "aaaaaaaa-0000-4000-8000-000000000001";
const std::string host_b = "bbbbbbbb-0000-4000-8000-000000000002";
const std::string uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";

PlacementAnswer conflict(const std::string& code, const std::string& detail) {
  return {409, R"({"errors": [{"status": 409, "code": ")" + code + R"(", "detail": ")" + detail + R"("}]})"};
}

std::string allocations_json(const std::string& host) {
  return R"({")" + host + R"(": {"resources": {"VCPU": 1}}})";
}

// A Placement holding one consumer's allocation on one host at a generation, offering the
// hosts in `offered` as candidates.
struct PlacementBooks {
  std::string held_on;  // empty: the consumer holds nothing
  int generation = 1;
  std::vector<std::string> offered;

  PlacementAnswer answer(const PlacementRequest& request) {
    if (request.method == "GET" && request.target.starts_with("/allocations/")) {
      std::string body = R"({"allocations": )" + (held_on.empty() ? std::string("{}") : allocations_json(held_on)) +
                         R"(, "consumer_generation": )" + std::to_string(generation) + "}";
      return {200, body};
    }
    if (request.method == "GET" && request.target.starts_with("/allocation_candidates")) {
      std::string requests, summaries;
      for (const std::string& host : offered) {
        requests += std::string(requests.empty() ? "" : ",") + R"({"allocations": )" + allocations_json(host) + "}";
        summaries += std::string(summaries.empty() ? "" : ",") + "\"" + host +
                     R"(": {"resources": {"VCPU": {"capacity": 8, "used": 0}}})";
      }
      return {200, R"({"allocation_requests": [)" + requests + R"(], "provider_summaries": {)" + summaries + "}}"};
    }
    if (request.method == "PUT" && request.target == "/allocations/" + uuid) {
      const std::string expected = R"("consumer_generation":)" + std::to_string(generation);
      if (request.body.find(expected) == std::string::npos)
        return conflict("placement.concurrent_update", "consumer generation conflict");
      held_on = request.body.find(host_a) != std::string::npos ? host_a : host_b;
      ++generation;
      return {204, ""};
    }
    return {404, R"({"errors": [{"status": 404, "detail": "not here"}]})"};
  }
};

struct Bench {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> busy = asio::make_work_guard(io);
  FakePlacement placement_server{io};
  Config config = [this] {
    Config c;
    c.placement.endpoint = placement_server.endpoint();
    return c;
  }();
  std::shared_ptr<FakeEtcd> etcd = std::make_shared<FakeEtcd>();
  PlacementClient placement{io.get_executor(), config.placement};
  Placer placer{placement, *etcd, config};
  KeyLayout keys{config.etcd.prefix};

  ~Bench() {
    placement_server.close();
    busy.reset();
    io.run_for(2s);
  }

  // Runs `task` on the loop to its end.
  template <class T>
  T run(awaitable<T> task) {
    std::optional<T> out;
    asio::co_spawn(io, std::move(task), [&](std::exception_ptr failure, T value) {
      if (failure) std::rethrow_exception(failure);
      out = std::move(value);
    });
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!out && std::chrono::steady_clock::now() < deadline) io.run_one_for(20ms);
    REQUIRE(out);
    return std::move(*out);
  }

  void live(const std::vector<std::string>& hosts) {
    for (const std::string& host : hosts) {
      HostRecord record;
      record.provider = host;
      record.name = host.substr(0, 8);
      record.status = "READY";
      etcd->put_now(keys.host(host), encode(record));
    }
  }
  int puts() const {
    int n = 0;
    for (const PlacementRequest& r : placement_server.requests) n += r.method == "PUT";
    return n;
  }
};

// An instance on host A, ready to move.
struct Moving {
  Relocation move;
  int64_t revision = 0;
  Moving(Bench& bench) {
    WorkSpec work;
    work.uuid = uuid;
    work.query = "resources=VCPU:1";
    work.resources = {{"VCPU", 1}};
    revision = bench.etcd->put_now(bench.keys.work(host_a, uuid), encode(work)).kv.mod_revision;
    move.work = work;
    move.record.uuid = uuid;
    move.record.state = InstanceState::scheduled;
    move.from = host_a;
    move.work_revision = revision;
    move.deadline = std::chrono::steady_clock::now();
  }
};

}  // namespace

TEST_CASE("a first-fit claim retries a host whose generation moved and passes one that is full") {
  Bench bench;
  std::vector<PlacementAnswer> answers{conflict("placement.concurrent_update", "resource provider generation conflict"),
                                       conflict("placement.undefined_code", "Unable to allocate inventory"),
                                       PlacementAnswer{204, ""}};
  bench.placement_server.answer = [&](const PlacementRequest&) {
    PlacementAnswer next = answers.front();
    answers.erase(answers.begin());
    return next;
  };
  Allocations on_a{{host_a, {{"VCPU", 1}}}}, on_b{{host_b, {{"VCPU", 1}}}};
  std::vector<Choice> choices{{host_a, &on_a}, {host_b, &on_b}};
  auto claimed = bench.run(bench.placer.claim_first_fit(uuid, choices));
  REQUIRE(claimed);
  CHECK(claimed->host == host_b);
  const auto& requests = bench.placement_server.requests;
  REQUIRE(requests.size() == 3);
  CHECK(requests[0].body.find(host_a) != std::string::npos);  // the same host again after the generation conflict
  CHECK(requests[1].body.find(host_a) != std::string::npos);
  CHECK(requests[2].body.find(host_b) != std::string::npos);
}

TEST_CASE("a first-fit claim with no host that fits says no allocations left") {
  Bench bench;
  bench.placement_server.answer = [](const PlacementRequest&) {
    return conflict("placement.undefined_code", "would exceed the capacity");
  };
  Allocations on_a{{host_a, {{"VCPU", 1}}}};
  std::vector<Choice> choices{{host_a, &on_a}};
  auto claimed = bench.run(bench.placer.claim_first_fit(uuid, choices));
  REQUIRE_FALSE(claimed);
  CHECK(claimed.error() == errc::no_allocations_left);
}

TEST_CASE("relocate moves the allocation and the work to another live host") {
  Bench bench;
  PlacementBooks books{host_a, 1, {host_a, host_b}};
  bench.placement_server.answer = [&](const PlacementRequest& r) { return books.answer(r); };
  bench.live({host_a, host_b});
  Moving moving(bench);
  auto moved = bench.run(bench.placer.relocate(moving.move));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::moved);
  CHECK(moved->host == host_b);
  CHECK(books.held_on == host_b);
  CHECK(bench.etcd->find(bench.keys.work(host_b, uuid)));
  CHECK_FALSE(bench.etcd->find(bench.keys.work(host_a, uuid)));
  auto record = decode_instance(bench.etcd->find(bench.keys.instance(uuid))->value);
  REQUIRE(record);
  CHECK(record->host == host_b);
}

TEST_CASE("relocate whose work changed meanwhile hands nothing over and puts the allocation back") {
  Bench bench;
  PlacementBooks books{host_a, 1, {host_b}};
  bench.placement_server.answer = [&](const PlacementRequest& r) { return books.answer(r); };
  bench.live({host_a, host_b});
  Moving moving(bench);
  // A stop lands after the move read the work.
  WorkSpec stopped = moving.move.work;
  stopped.power = PowerState::stopped;
  bench.etcd->put_now(bench.keys.work(host_a, uuid), encode(stopped));
  auto moved = bench.run(bench.placer.relocate(moving.move));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::put_back);
  CHECK(books.held_on == host_a);
  CHECK(bench.puts() == 2);  // there, and back
  CHECK_FALSE(bench.etcd->find(bench.keys.work(host_b, uuid)));
  CHECK(decode_work(bench.etcd->find(bench.keys.work(host_a, uuid))->value)->power == PowerState::stopped);
}

TEST_CASE("relocate with no other live host that fits leaves everything where it was") {
  Bench bench;
  PlacementBooks books{host_a, 1, {host_a, host_b}};
  bench.placement_server.answer = [&](const PlacementRequest& r) { return books.answer(r); };
  bench.live({host_a});  // B offers room but has no live agent
  Moving moving(bench);
  auto moved = bench.run(bench.placer.relocate(moving.move));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::no_room);
  CHECK(bench.puts() == 0);
  CHECK(books.held_on == host_a);
}

TEST_CASE("relocate of an instance another move already took is a lost race, and writes nothing") {
  Bench bench;
  PlacementBooks books{host_b, 3, {host_a, host_b}};  // the allocation is on B already
  bench.placement_server.answer = [&](const PlacementRequest& r) { return books.answer(r); };
  bench.live({host_a, host_b});
  Moving moving(bench);
  const int txns = bench.etcd->txns;
  auto moved = bench.run(bench.placer.relocate(moving.move));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::lost_race);
  CHECK(bench.puts() == 0);
  CHECK(bench.etcd->txns == txns);
}
