// The placer against Placement (its HTTP face, or in memory) and etcd in memory: first-fit
// claims through conflicts, and the one move engine's outcomes, without servers.
#include "fakes/fake_etcd.hpp"
#include "fakes/fake_placement.hpp"
#include "fakes/memory_placement.hpp"

#include "model/uuid.hpp"
#include "services/move_request.hpp"
#include "services/placer.hpp"

#include "catch_result.hpp"

#include <boost/asio/executor_work_guard.hpp>

#include <map>
#include <set>

using namespace toyvm;
using namespace std::chrono_literals;
using fakes::FakeEtcd;
using fakes::FakePlacement;
using fakes::MemoryPlacement;
using fakes::PlacementAnswer;
using fakes::PlacementRequest;

namespace {

const std::string host_a = "aaaaaaaa-0000-4000-8000-000000000001";
const std::string host_b = "bbbbbbbb-0000-4000-8000-000000000002";
const std::string uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";

PlacementAnswer conflict(const std::string& code, const std::string& detail) {
  return {409, R"({"errors": [{"status": 409, "code": ")" + code + R"(", "detail": ")" + detail + R"("}]})"};
}

const std::string migration = "11111111-2222-4333-8444-555555555555";

// An event loop for the placer's coroutines, run to each one's end.
struct Loop {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> busy = asio::make_work_guard(io);

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
};

// The placer over Placement and etcd in memory: hosts A and B with room for two instances
// each, and the instance holding VCPU:1 on A.
struct Bench : Loop {
  Config config;
  std::shared_ptr<FakeEtcd> etcd = std::make_shared<FakeEtcd>();
  MemoryPlacement placement;
  Placer placer{placement, *etcd, config};
  KeyLayout keys{config.etcd.prefix};

  Bench() {
    for (const std::string& host : {host_a, host_b}) {
      placement.add_provider(host, host.substr(0, 8), {{"VCPU", 2}});
      placement.providers_by_uuid[host].traits.insert(config.placement.provider_trait);  // toyvm's hosts
    }
    placement.consumers[uuid] = {{{host_a, {{"VCPU", 1}}}}, 1, ConsumerType::instance, team_a};
  }

  const ConsumerOwner team_a{"toyvm:team-a", "alice"};

  void live(const std::vector<std::string>& hosts) {
    for (const std::string& host : hosts) {
      HostRecord record;
      record.provider = host;
      record.name = host.substr(0, 8);
      record.status = "READY";
      if (auto known = placement.providers_by_uuid.find(host); known != placement.providers_by_uuid.end())
        record.capacity = capacity_of(known->second.inventory);
      etcd->put_now(keys.host(host), encode(record));
    }
  }
  // Placement's books, as a count of allocation writes.
  int writes() const { return generation(uuid) + generation(migration) - 1; }
  int generation(const std::string& consumer) const {
    auto found = placement.consumers.find(consumer);
    return found == placement.consumers.end() ? 0 : int(found->second.generation);
  }
};

// The placer over Placement's HTTP face, for what its requests must be.
struct HttpBench : Loop {
  FakePlacement placement_server{io};
  Config config = [this] {
    Config c;
    c.placement.endpoint = placement_server.endpoint();
    return c;
  }();
  std::shared_ptr<FakeEtcd> etcd = std::make_shared<FakeEtcd>();
  PlacementClient placement{io.get_executor(), config.placement};
  Placer placer{placement, *etcd, config};

  ~HttpBench() {
    placement_server.close();
    busy.reset();
    io.run_for(2s);
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
  HttpBench bench;
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
  auto claimed = bench.run(bench.placer.claim_first_fit(uuid, choices, ConsumerOwner{"toyvm:team-a", "alice"}));
  REQUIRE(claimed);
  CHECK(claimed->host == host_b);
  const auto& requests = bench.placement_server.requests;
  REQUIRE(requests.size() == 3);
  // The consumer is its project's, and its maker's.
  CHECK(requests[2].body.find(R"("project_id":"toyvm:team-a")") != std::string::npos);
  CHECK(requests[2].body.find(R"("user_id":"alice")") != std::string::npos);
  CHECK(requests[0].body.find(host_a) != std::string::npos);  // the same host again after the generation conflict
  CHECK(requests[1].body.find(host_a) != std::string::npos);
  CHECK(requests[2].body.find(host_b) != std::string::npos);
}

TEST_CASE("a claim sent again after its answer was lost is this claim only if its consumers hold what it asks") {
  HttpBench bench;
  const std::string other = "22222222-3333-4444-8555-666666666666";
  // The claim is refused: its consumers exist (an earlier try landed). Each holds VCPU:1 on the
  // host `held_on` names for it, as GET /allocations/{consumer} says.
  std::map<std::string, std::string> held_on;
  bench.placement_server.answer = [&](const PlacementRequest& request) {
    if (request.method != "GET")
      return conflict("placement.concurrent_update", "consumer generation conflict - expected null but got 1");
    const std::string consumer = request.target.substr(request.target.rfind('/') + 1);
    return PlacementAnswer{200, R"({"allocations": {")" + held_on[consumer] + R"(": {"resources": {"VCPU": 1}}},
                                    "consumer_generation": 1, "project_id": "toyvm", "user_id": "toyvm"})"};
  };
  Allocations on_a{{host_a, {{"VCPU", 1}}}}, on_b{{host_b, {{"VCPU", 1}}}};
  std::vector<std::pair<std::string, Allocations>> asked{{uuid, on_a}, {other, on_b}};
  const ConsumerOwner owner{"toyvm", "toyvm"};

  SECTION("each holds what this request asks: it was this request") {
    held_on = {{uuid, host_a}, {other, host_b}};
    CHECK(bench.run(bench.placement.claim_all(asked, owner)));
  }
  SECTION("one holds another plan's: not this request, and said so") {
    held_on = {{uuid, host_a}, {other, host_a}};  // an earlier try planned the second there too
    auto claimed = bench.run(bench.placement.claim_all(asked, owner));
    REQUIRE_FALSE(claimed);
    CHECK(claimed.error() == errc::placement_consumer_changed);
  }
  SECTION("one consumer's claim, the same") {
    held_on[uuid] = host_b;
    auto claimed = bench.run(bench.placement.claim(uuid, on_a, owner));
    REQUIRE_FALSE(claimed);
    CHECK(claimed.error() == errc::placement_consumer_changed);
    held_on[uuid] = host_a;
    CHECK(bench.run(bench.placement.claim(uuid, on_a, owner)));
  }
}

TEST_CASE("a first-fit claim with no host that fits says no allocations left") {
  HttpBench bench;
  bench.placement_server.answer = [](const PlacementRequest&) {
    return conflict("placement.undefined_code", "would exceed the capacity");
  };
  Allocations on_a{{host_a, {{"VCPU", 1}}}};
  std::vector<Choice> choices{{host_a, &on_a}};
  auto claimed = bench.run(bench.placer.claim_first_fit(uuid, choices, ConsumerOwner{"toyvm", "toyvm"}));
  REQUIRE_FALSE(claimed);
  CHECK(claimed.error() == errc::no_allocations_left);
}

TEST_CASE("a sample reads host records from a random point on, and asks Placement about each alone") {
  Bench bench;
  const std::string host_c = "cccccccc-0000-4000-8000-000000000003";
  bench.placement.add_provider(host_c, "cccccccc", {{"VCPU", 2}});  // no provider trait: not asked for
  bench.live({host_a, host_b, host_c});
  const std::string past_c = "d0000000-0000-4000-8000-000000000000";

  SECTION("resources alone: each host's usage, beside the capacity its record names") {
    PlacementQuery query = *parse_placement_query("resources=VCPU:2");
    // From between A and B on: B, then C. B has room, C too; A (holding one) is not asked about.
    auto view = bench.run(bench.placer.sample(query, 2, "b0000000-0000-4000-8000-000000000000"));
    REQUIRE(view);
    CHECK(view->live == std::set<std::string>{host_b, host_c});
    CHECK(view->candidates.allocation_requests ==
          std::vector<Allocations>{{{host_b, {{"VCPU", 2}}}}, {{host_c, {{"VCPU", 2}}}}});
    CHECK(bench.placement.usages_asked == std::vector<std::string>{host_b, host_c});
    CHECK(bench.placement.queries.empty());

    // From past C, round to the start: A, whose room (one VCPU) is too little: no candidates.
    auto wrapped = bench.run(bench.placer.sample(query, 1, past_c));
    REQUIRE(wrapped);
    CHECK(wrapped->live == std::set<std::string>{host_a});
    CHECK(wrapped->candidates.allocation_requests.empty());
    CHECK(bench.placement.usages_asked.back() == host_a);
  }

  SECTION("with traits: Placement's search about each host alone") {
    PlacementQuery query = *parse_placement_query("resources=VCPU:2&required=!CUSTOM_SLOW");
    auto view = bench.run(bench.placer.sample(query, 2, "b0000000-0000-4000-8000-000000000000"));
    REQUIRE(view);
    CHECK(view->live == std::set<std::string>{host_b, host_c});
    CHECK(view->candidates.provider_summaries.size() == 2);
    REQUIRE(bench.placement.queries.size() == 2);
    for (const std::string& asked : bench.placement.queries) {
      CHECK(asked.find("in_tree=") != std::string::npos);
      CHECK(asked.find(bench.config.placement.provider_trait) == std::string::npos);
      CHECK(asked.find("required=!COMPUTE_STATUS_DISABLED") != std::string::npos);
    }
    CHECK(bench.placement.usages_asked.empty());
    bench.placement.queries.clear();
    auto wrapped = bench.run(bench.placer.sample(query, 1, past_c));
    REQUIRE(wrapped);
    CHECK(wrapped->candidates.allocation_requests.empty());
    REQUIRE(bench.placement.queries.size() == 1);
    CHECK(bench.placement.queries[0].find("in_tree=" + host_a) != std::string::npos);
  }

  SECTION("a host whose record says more room than Placement has costs its claim a try, never an overbooking") {
    HostRecord roomy = *decode_host(bench.etcd->find(bench.keys.host(host_a))->value);
    roomy.capacity["VCPU"] = 8;
    bench.etcd->put_now(bench.keys.host(host_a), encode(roomy));
    PlacementQuery query = *parse_placement_query("resources=VCPU:2");
    auto view = bench.run(bench.placer.sample(query, 1, past_c));
    REQUIRE(view);
    REQUIRE(view->candidates.allocation_requests.size() == 1);
    auto ranked = Placer::rank(*view, WeighPolicy{}, 0.0, std::nullopt);
    auto claimed = bench.run(bench.placer.claim_first_fit("99999999-0000-4000-8000-000000000009", ranked,
                                                          bench.team_a));
    REQUIRE_FALSE(claimed);
    CHECK(claimed.error() == errc::no_allocations_left);
    CHECK(bench.placement.used_on(host_a) == ResourceAmounts{{"VCPU", 1}});
  }

  SECTION("Placement not answering is not \"no room\"") {
    bench.placement.down = true;
    for (const char* text : {"resources=VCPU:2", "resources=VCPU:2&required=!CUSTOM_SLOW"}) {
      auto unanswered = bench.run(bench.placer.sample(*parse_placement_query(text), 2, past_c));
      REQUIRE_FALSE(unanswered);
      CHECK(unanswered.error() == errc::placement_unavailable);
    }
  }
}

TEST_CASE("a look in a shard no host has joined finds no room there; another unknown trait is refused") {
  Bench bench;
  bench.live({host_a});
  bench.placement.providers_by_uuid[host_a].traits.insert(shard_trait(0));
  // Placement has never heard of shard 1's trait: no host has it.
  auto empty = bench.run(bench.placer.look(*parse_placement_query("resources=VCPU:1&required=" + shard_trait(1)), ""));
  REQUIRE(empty);
  CHECK(empty->candidates.allocation_requests.empty());
  auto found = bench.run(bench.placer.look(*parse_placement_query("resources=VCPU:1&required=" + shard_trait(0)), ""));
  REQUIRE(found);
  CHECK(found->live == std::set<std::string>{host_a});
  auto refused = bench.run(bench.placer.look(*parse_placement_query("resources=VCPU:1&required=CUSTOM_NOWHERE"), ""));
  REQUIRE_FALSE(refused);
  CHECK(refused.error() == errc::invalid_argument);
}

TEST_CASE("a look asks etcd again while it does not answer (an election), but not past its patience") {
  Bench bench;
  bench.config.etcd.timeout = 300ms;
  bench.live({host_a, host_b});
  const PlacementQuery query = *parse_placement_query("resources=VCPU:1");

  bench.etcd->lost_txns = 2;  // "leader changed", twice
  auto view = bench.run(bench.placer.look(query, "group"));
  REQUIRE(view);
  CHECK(view->live == std::set<std::string>{host_a, host_b});
  CHECK(bench.etcd->unanswered == 2);

  bench.etcd->down = true;  // for good
  const auto asked = std::chrono::steady_clock::now();
  auto unanswered = bench.run(bench.placer.look(query, ""));
  REQUIRE_FALSE(unanswered);
  CHECK(unanswered.error() == errc::etcd_unavailable);
  CHECK(bench.etcd->unanswered > 3);
  CHECK(std::chrono::steady_clock::now() - asked >= bench.config.etcd.timeout);
}

TEST_CASE("only a query of one request group that names no place is sampled") {
  auto samplable = [](const char* text) { return Placer::samplable(*parse_placement_query(text)); };
  CHECK(samplable("resources=VCPU:1,MEMORY_MB:256"));
  CHECK(samplable("resources=VCPU:1&required=HW_CPU_X86_AVX2,!CUSTOM_SLOW&limit=5"));
  CHECK_FALSE(samplable("resources=VCPU:1&member_of=in:11111111-2222-4333-8444-555555555555"));
  CHECK_FALSE(samplable("resources=VCPU:1&in_tree=11111111-2222-4333-8444-555555555555"));
  CHECK_FALSE(samplable("resources1=VCPU:1&resources2=MEMORY_MB:256&group_policy=isolate"));
}

TEST_CASE("relocate moves the allocation and the work to another live host") {
  Bench bench;
  bench.live({host_a, host_b});
  Moving moving(bench);
  auto moved = bench.run(bench.placer.relocate(moving.move, moving.record));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::moved);
  CHECK(moved->host == host_b);
  CHECK(bench.placement.held_on(uuid) == host_b);
  CHECK(bench.etcd->find(bench.keys.work(host_b, uuid)));
  CHECK_FALSE(bench.etcd->find(bench.keys.work(host_a, uuid)));
  auto record = decode_instance(bench.etcd->find(bench.keys.instance(uuid))->value);
  REQUIRE(record);
  CHECK(record->host == host_b);
}

TEST_CASE("relocate whose work changed meanwhile hands nothing over and puts the allocation back") {
  Bench bench;
  bench.live({host_a, host_b});
  Moving moving(bench);
  // A stop lands after the move read the work.
  WorkSpec stopped = moving.move.work;
  stopped.power = PowerState::stopped;
  bench.etcd->put_now(bench.keys.work(host_a, uuid), encode(stopped));
  auto moved = bench.run(bench.placer.relocate(moving.move, moving.record));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::put_back);
  CHECK(bench.placement.held_on(uuid) == host_a);
  CHECK(bench.writes() == 2);  // there, and back
  CHECK_FALSE(bench.etcd->find(bench.keys.work(host_b, uuid)));
  CHECK(decode_work(bench.etcd->find(bench.keys.work(host_a, uuid))->value)->power == PowerState::stopped);
}

TEST_CASE("relocate with no other live host that fits leaves everything where it was") {
  Bench bench;
  bench.live({host_a});  // B offers room but has no live agent
  Moving moving(bench);
  auto moved = bench.run(bench.placer.relocate(moving.move, moving.record));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::no_room);
  CHECK(bench.writes() == 0);
  CHECK(bench.placement.held_on(uuid) == host_a);
}

TEST_CASE("relocate of an instance another move already took is a lost race, and writes nothing") {
  Bench bench;
  bench.placement.consumers[uuid] = {{{host_b, {{"VCPU", 1}}}}, 3};  // the allocation is on B already
  bench.live({host_a, host_b});
  Moving moving(bench);
  const int txns = bench.etcd->txns;
  auto moved = bench.run(bench.placer.relocate(moving.move, moving.record));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::lost_race);
  CHECK(bench.generation(uuid) == 3);
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
  bench.live({host_a, host_b});
  Asked asked(bench);
  auto moved = bench.run(bench.placer.claim_move(asked.move, asked.record));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::moved);
  CHECK(moved->host == host_b);
  CHECK(bench.placement.held_on(uuid) == host_b);
  CHECK(bench.placement.held_on(migration) == host_a);
  // Both consumers stay the instance's owner's, the migration's in the project's moving id, and
  // its project counts the instance once.
  CHECK(bench.placement.consumers[uuid].owner == bench.team_a);
  CHECK(bench.placement.consumers[migration].owner ==
        ConsumerOwner{moving_project_id(bench.team_a.project), bench.team_a.user});
  CHECK(bench.placement.consumers[migration].type == ConsumerType::migration);
  auto used = bench.run(bench.placement.project_usage("toyvm:team-a"));
  REQUIRE(used);
  CHECK(*used == ProjectUsage{1, {{"VCPU", 1}}});
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
  bench.live({host_a, host_b});
  Asked asked(bench);
  MoveRecord undone = asked.record;
  undone.state = MoveState::reverting;
  bench.etcd->put_now(bench.keys.move(uuid), encode(undone));
  auto moved = bench.run(bench.placer.claim_move(asked.move, asked.record));
  REQUIRE(moved);
  CHECK(moved->outcome == Relocated::Outcome::put_back);
  CHECK(bench.placement.held_on(uuid) == host_a);
  CHECK(bench.placement.held_on(migration).empty());
  CHECK(bench.placement.consumers[uuid].owner == bench.team_a);  // not the migration's moving id
  CHECK(decode_move(bench.etcd->find(bench.keys.move(uuid))->value)->state == MoveState::reverting);
}

TEST_CASE("claim_move to a named host asks Placement for that host only, and a resize may stay") {
  Bench bench;
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
  CHECK(bench.placement.held_on(uuid) == host_a);
  CHECK(bench.placement.held_on(migration) == host_a);
  int named = 0;
  for (const std::string& query : bench.placement.queries) named += query.find("in_tree=" + host_a) != std::string::npos;
  CHECK(named == 2);
}

TEST_CASE("claim_move with Placement down says so, and writes nothing anywhere") {
  Bench bench;
  bench.live({host_a, host_b});
  Asked asked(bench);
  const int txns = bench.etcd->txns;
  bench.placement.down = true;
  auto moved = bench.run(bench.placer.claim_move(asked.move, asked.record));
  REQUIRE_FALSE(moved);
  CHECK(moved.error() == errc::placement_unavailable);
  CHECK(bench.etcd->txns == txns);
  CHECK(decode_move(bench.etcd->find(bench.keys.move(uuid))->value)->state == MoveState::preparing);
  CHECK(bench.placement.held_on(uuid) == host_a);
  CHECK(bench.placement.held_on(migration).empty());
}

TEST_CASE("a move powered off is said moved once its guest runs there, not when its record ends") {
  Bench bench;
  MoveRequests moves(*bench.etcd, bench.placer, bench.keys);
  MoveRecord record{.instance = uuid, .migration = migration, .source = host_a, .destination = host_b,
                    .kind = MoveKind::cold, .state = MoveState::claimed};
  MoveAsked asked{record, bench.etcd->put_now(bench.keys.move(uuid), encode(record)).kv.mod_revision};
  InstanceRecord instance;
  instance.uuid = uuid;
  instance.host = host_b;
  instance.state = InstanceState::building;  // switched over, its guest being started there
  bench.etcd->put_now(bench.keys.instance(uuid), encode(instance));
  bench.etcd->erase_now(bench.keys.move(uuid));
  std::optional<result<MoveEnded>> ended;
  auto follow = [&]() -> awaitable<void> { ended = co_await moves.follow(asked, 10s); };
  asio::co_spawn(bench.io, follow(), asio::detached);
  for (int turns = 0; turns < 50; ++turns) bench.io.run_one_for(20ms);
  CHECK_FALSE(ended);  // not while it is being started
  instance.state = InstanceState::active;
  bench.etcd->put_now(bench.keys.instance(uuid), encode(instance));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!ended && std::chrono::steady_clock::now() < deadline) bench.io.run_one_for(20ms);
  REQUIRE(ended);
  REQUIRE(*ended);
  CHECK((*ended)->moved);
  CHECK((*ended)->host == host_b);
}

TEST_CASE("a look's scope widens from a sample to a shard, two others at random, then the whole cloud, once each") {
  LookScope sampled(2, 4);
  CHECK(sampled.sample() == 2);
  const std::string first = sampled.shard();
  CHECK_FALSE(first.empty());
  REQUIRE(sampled.widen());
  CHECK(sampled.sample() == 0);
  CHECK(sampled.shard() == first);
  std::set<std::string> shards{first};
  for (int i = 0; i < 2; ++i) {
    REQUIRE(sampled.widen());
    CHECK_FALSE(sampled.shard().empty());
    shards.insert(sampled.shard());
  }
  CHECK(shards.size() == 3);  // never one shard twice
  REQUIRE(sampled.widen());
  CHECK(sampled.shard().empty());
  CHECK(sampled.describe() == "the whole cloud");
  CHECK_FALSE(sampled.widen());

  LookScope two_shards(0, 2);
  const std::string one = two_shards.shard();
  REQUIRE(two_shards.widen());
  CHECK(two_shards.shard() != one);
  CHECK_FALSE(two_shards.shard().empty());
  REQUIRE(two_shards.widen());
  CHECK(two_shards.shard().empty());
  CHECK_FALSE(two_shards.widen());

  LookScope unsharded(0, 1);
  CHECK(unsharded.shard().empty());
  CHECK(unsharded.sample() == 0);
  CHECK_FALSE(unsharded.widen());
}
