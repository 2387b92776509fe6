// The placer against Placement's HTTP face and etcd in memory: first-fit claims through
// conflicts, and the one move engine's outcomes, without servers.
#include "fakes/fake_etcd.hpp"
#include "fakes/fake_placement.hpp"

#include "services/placer.hpp"

#include "catch_result.hpp"

#include <boost/json.hpp>

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

const std::string migration = "11111111-2222-4333-8444-555555555555";

// A Placement holding one consumer's allocation on one host at a generation (and its
// migration consumer's, while it moves), offering the hosts in `offered` as candidates.
struct PlacementBooks {
  std::string held_on;  // empty: the consumer holds nothing
  int generation = 1;
  std::vector<std::string> offered;
  std::string migration_on{};  // where the migration consumer holds the source's share
  int migration_generation = 0;

  // The one host a consumer's allocations in a request body name (empty: none).
  static std::string host_of(const boost::json::value& consumer) {
    const auto& allocations = consumer.at("allocations").as_object();
    return allocations.empty() ? "" : std::string(allocations.begin()->key());
  }

  PlacementAnswer answer(const PlacementRequest& request) {
    if (request.method == "GET" && request.target == "/allocations/" + migration) {
      std::string body = R"({"allocations": )" +
                         (migration_on.empty() ? std::string("{}") : allocations_json(migration_on)) +
                         R"(, "consumer_generation": )" + std::to_string(migration_generation) + "}";
      return {200, body};
    }
    if (request.method == "GET" && request.target.starts_with("/allocations/")) {
      std::string body = R"({"allocations": )" + (held_on.empty() ? std::string("{}") : allocations_json(held_on)) +
                         R"(, "consumer_generation": )" + std::to_string(generation) + "}";
      return {200, body};
    }
    // Both consumers at once, each under the generation it was read at.
    if (request.method == "POST" && request.target == "/allocations") {
      auto body = boost::json::parse(request.body).as_object();
      const auto& instance = body.at(uuid);
      const auto& moving = body.at(migration);
      if (instance.at("consumer_generation") != boost::json::value(generation) ||
          (!moving.at("consumer_generation").is_null() &&
           moving.at("consumer_generation") != boost::json::value(migration_generation)))
        return conflict("placement.concurrent_update", "consumer generation conflict");
      held_on = host_of(instance);
      migration_on = host_of(moving);
      ++generation;
      ++migration_generation;
      return {204, ""};
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
  InstanceRecord record;
  int64_t revision = 0;
  Moving(Bench& bench) {
    WorkSpec work;
    work.uuid = uuid;
    work.query = "resources=VCPU:1";
    work.resources = {{"VCPU", 1}};
    revision = bench.etcd->put_now(bench.keys.work(host_a, uuid), encode(work)).kv.mod_revision;
    move.work = work;
    record.uuid = uuid;
    record.state = InstanceState::scheduled;
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
  auto moved = bench.run(bench.placer.relocate(moving.move, moving.record));
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
  auto moved = bench.run(bench.placer.relocate(moving.move, moving.record));
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
  auto moved = bench.run(bench.placer.relocate(moving.move, moving.record));
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
  auto moved = bench.run(bench.placer.relocate(moving.move, moving.record));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::lost_race);
  CHECK(bench.puts() == 0);
  CHECK(bench.etcd->txns == txns);
}

namespace {

// The move of the instance on host A, asked: its record written, preparing.
struct Asked {
  Relocation move;
  MoveRecord record;
  Asked(Bench& bench) {
    Moving moving(bench);
    record.instance = uuid;
    record.migration = migration;
    record.source = host_a;
    record.state = MoveState::preparing;
    record.started_at = 1;
    const int64_t written = bench.etcd->put_now(bench.keys.move(uuid), encode(record)).kv.mod_revision;
    move = moving.move;
    move.also_require = {EtcdCompare::mod_revision_is(bench.keys.move(uuid), written)};
  }
};

}  // namespace

TEST_CASE("claim_move claims the best other host: the migration consumer keeps the source's share") {
  Bench bench;
  PlacementBooks books{host_a, 1, {host_a, host_b}};
  bench.placement_server.answer = [&](const PlacementRequest& r) { return books.answer(r); };
  bench.live({host_a, host_b});
  Asked asked(bench);
  auto moved = bench.run(bench.placer.claim_move(asked.move, asked.record));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::moved);
  CHECK(moved->host == host_b);
  CHECK(books.held_on == host_b);
  CHECK(books.migration_on == host_a);
  // The work stays with its source until the guest has moved; the record names where it goes.
  CHECK(bench.etcd->find(bench.keys.work(host_a, uuid)));
  CHECK_FALSE(bench.etcd->find(bench.keys.work(host_b, uuid)));
  const auto* record = bench.etcd->find(bench.keys.move(uuid));
  REQUIRE(record);
  CHECK(record->mod_revision == moved->revision);
  auto claimed = decode_move(record->value);
  REQUIRE(claimed);
  CHECK(claimed->state == MoveState::claimed);
  CHECK(claimed->destination == host_b);
}

TEST_CASE("claim_move whose record its source undid meanwhile swaps the books back") {
  Bench bench;
  PlacementBooks books{host_a, 1, {host_b}};
  bench.placement_server.answer = [&](const PlacementRequest& r) { return books.answer(r); };
  bench.live({host_a, host_b});
  Asked asked(bench);
  MoveRecord undone = asked.record;
  undone.state = MoveState::reverting;
  bench.etcd->put_now(bench.keys.move(uuid), encode(undone));
  auto moved = bench.run(bench.placer.claim_move(asked.move, asked.record));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::put_back);
  CHECK(books.held_on == host_a);
  CHECK(books.migration_on.empty());
  CHECK(decode_move(bench.etcd->find(bench.keys.move(uuid))->value)->state == MoveState::reverting);
}

TEST_CASE("claim_move to a named host asks Placement for that host only, and a resize may stay") {
  Bench bench;
  PlacementBooks books{host_a, 1, {host_a}};
  bench.placement_server.answer = [&](const PlacementRequest& r) { return books.answer(r); };
  bench.live({host_a, host_b});
  Asked asked(bench);
  asked.move.to = host_a;
  // Not allowed to stay, its own host is no choice.
  auto stayed = bench.run(bench.placer.claim_move(asked.move, asked.record));
  REQUIRE(stayed);
  CHECK(stayed->outcome == Relocated::Outcome::no_room);
  asked.move.may_stay = true;
  auto moved = bench.run(bench.placer.claim_move(asked.move, asked.record));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::moved);
  CHECK(moved->host == host_a);
  CHECK(books.held_on == host_a);
  CHECK(books.migration_on == host_a);
  int named = 0;
  for (const PlacementRequest& r : bench.placement_server.requests)
    named += r.target.starts_with("/allocation_candidates") && r.target.find("in_tree=" + host_a) != std::string::npos;
  CHECK(named == 2);
}
