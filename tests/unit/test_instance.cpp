// The agent's instances against etcd, libvirt and Placement fakes: each decision path of an
// Instance, driven by the news it gets, without servers.
#include "fakes/fake_etcd.hpp"
#include "fakes/memory_placement.hpp"
#include "fakes/fake_virt.hpp"

#include "services/compute/agent.hpp"

#include "catch_result.hpp"

#include <boost/asio/executor_work_guard.hpp>

using namespace toyvm;
using namespace toyvm::compute;
using namespace std::chrono_literals;
using fakes::FakeEtcd;
using fakes::MemoryPlacement;
using fakes::FakeVirt;

namespace {

const std::string host = "5b9c3e5e-8d7e-4a57-9d36-2f0d4a9c0001";
const std::string uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";

Config test_config() {
  Config config;
  config.compute.network.clear();  // no NIC: no address to look for
  config.compute.max_build_attempts = 1;
  return config;
}

// One agent's parts over fakes of etcd, Placement and libvirt, on a loop the test turns.
struct Agent {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> busy = asio::make_work_guard(io);
  Config config = test_config();
  std::shared_ptr<FakeEtcd> etcd = std::make_shared<FakeEtcd>();
  MemoryPlacement placement;
  asio::thread_pool pool{1};
  FakeVirt* virt_backend = new FakeVirt;  // owned by `virt`
  VirtCalls virt{pool, std::unique_ptr<VirtBackend>(virt_backend)};
  StopSignal stop;
  AgentContext ctx{io, config, KeyLayout(config.etcd.prefix), etcd, placement, pool, virt,
                   HostIdentity{host, "test", "/nonexistent"}, stop, {}, {}};
  AgentParts parts{ctx, {}, {}, ImageStoreOptions{}};
  Instances& instances = parts.instances;
  int64_t delivered = 0;  // the revision up to which etcd's changes reached the instances

  ~Agent() {
    ctx.stop.request();
    busy.reset();
    io.run_for(2s);
    pool.join();
  }

  FakeVirt& hypervisor() { return *virt_backend; }
  std::string work_key() const { return ctx.keys.work(host, uuid); }

  // Turns the loop until `done` holds, handing etcd's changes to this host's work to the
  // instances as its watch would; false when `limit` passes first.
  bool run_until(const std::function<bool()>& done, std::chrono::seconds limit = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      deliver();
      io.run_one_for(20ms);
    }
    return true;
  }
  void deliver() {
    const std::string prefix = ctx.keys.work_prefix(host);
    for (const WatchEvent& event : etcd->since(delivered)) {
      if (event.kv.key.starts_with(prefix)) instances.apply(event);
      if (event.kv.key.starts_with(ctx.keys.moves_prefix())) instances.apply_move(event);
    }
    delivered = etcd->revision();
  }
  // Settled: the instance is gone, or no step runs for it and none is due.
  bool settled() const {
    auto instance = instances.find(uuid);
    return !instance || instance->idle();
  }

  void put_work(PowerState power, const std::string& group = {}) {
    WorkSpec spec;
    spec.uuid = uuid;
    spec.resources = {{"VCPU", 1}, {"MEMORY_MB", 64}};
    spec.power = power;
    spec.group = group;
    etcd->put_now(work_key(), encode(spec));
    // What its schedule claimed for it.
    placement.consumers.try_emplace(uuid, MemoryPlacement::Consumer{{{host, spec.resources}}, 1});
  }
  std::optional<InstanceRecord> record() const {
    const KeyValue* kv = etcd->find(ctx.keys.instance(uuid));
    if (!kv) return std::nullopt;
    auto decoded = decode_instance(kv->value);
    return decoded ? std::optional<InstanceRecord>(*decoded) : std::nullopt;
  }
  bool recorded(InstanceState state) const { return record() && record()->state == state; }
  // As a listing after a restart (or a resync) finds it; the loop turns until it is applied.
  bool list() {
    bool applied = false;
    asio::co_spawn(io, listing(applied), asio::detached);
    delivered = etcd->revision();
    return run_until([&] { return applied; });
  }
  awaitable<void> listing(bool& applied) {
    auto range = co_await etcd->range_prefix(ctx.keys.work_prefix(host));
    co_await instances.apply_listing(std::move(*range));
    applied = true;
  }
};

}  // namespace

TEST_CASE("running work is built and recorded ACTIVE once, however often the news repeats") {
  Agent agent;
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  CHECK(agent.hypervisor().domain(uuid)->state == DomainState::running);
  CHECK(agent.instances.find(uuid)->phase() == Phase::active);
  const int txns = agent.etcd->txns;
  // The same value again (a resync's listing) and a start event of its own domain.
  REQUIRE(agent.list());
  agent.instances.observe(uuid, true);
  REQUIRE(agent.run_until([&] { return agent.settled(); }));
  CHECK(agent.hypervisor().creates() == 1);
  CHECK(agent.etcd->txns == txns);  // nothing recorded again
}

TEST_CASE("a resync asks nothing more of a guest as it should be, and starts one whose stop went unheard") {
  Agent agent;
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  const int asked = agent.hypervisor().state_asks();
  const int txns = agent.etcd->txns;
  REQUIRE(agent.list());
  REQUIRE(agent.run_until([&] { return agent.settled(); }));
  CHECK(agent.hypervisor().state_asks() == asked);
  CHECK(agent.etcd->txns == txns);
  // Its domain stopped and the event was lost (libvirt restarted, say): the next resync sees it.
  agent.hypervisor().set(uuid, FakeVirt::Domain{DomainState::stopped, StopCause::unknown, {}});
  REQUIRE(agent.list());
  REQUIRE(agent.run_until([&] {
    return agent.hypervisor().domain(uuid)->state == DomainState::running && agent.settled();
  }));
  CHECK(agent.hypervisor().state_asks() > asked);
  CHECK(agent.recorded(InstanceState::active));
}

TEST_CASE("stopped work stops the guest and records STOPPED; running work starts it again") {
  Agent agent;
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  agent.put_work(PowerState::stopped);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::stopped) && agent.settled(); }));
  CHECK(agent.hypervisor().domain(uuid)->state == DomainState::stopped);
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  CHECK(agent.hypervisor().domain(uuid)->state == DomainState::running);
  CHECK(agent.hypervisor().creates() == 1);
}

TEST_CASE("a guest that misses the first power button press is asked again, and powers itself off") {
  Agent agent;
  agent.config.compute.stop_timeout = std::chrono::seconds(30);
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  agent.hypervisor().power_off_at_press(2);
  agent.put_work(PowerState::stopped);
  // Well before stop_timeout would have it forced off.
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::stopped) && agent.settled(); }, 20s));
  CHECK(agent.hypervisor().presses() == 2);
}

TEST_CASE("a guest that powered itself off is STOPPED, and its work says so") {
  Agent agent;
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  agent.hypervisor().set(uuid, FakeVirt::Domain{DomainState::stopped, StopCause::shutdown, {}});
  agent.instances.observe(uuid, false);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::stopped) && agent.settled(); }));
  auto work = decode_work(agent.etcd->find(agent.work_key())->value);
  REQUIRE(work);
  CHECK(work->power == PowerState::stopped);  // never started behind the user's back
  CHECK(agent.hypervisor().domain(uuid)->state == DomainState::stopped);
}

TEST_CASE("work that cannot be read leaves its guest as it is until it can") {
  Agent agent;
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  agent.etcd->put_now(agent.work_key(), R"({"uuid": "something a newer writer wrote", "power": 7})");
  agent.deliver();
  // A listing that still finds the value: the instance is there, just not understood.
  REQUIRE(agent.list());
  REQUIRE(agent.run_until([&] { return agent.settled(); }));
  CHECK(agent.hypervisor().domain(uuid)->state == DomainState::running);
  CHECK(agent.instances.find(uuid));
  // A value it can read again: a destroy, which it carries out.
  agent.put_work(PowerState::deleted);
  REQUIRE(agent.run_until([&] { return !agent.instances.find(uuid); }));
  CHECK_FALSE(agent.hypervisor().domain(uuid));
  CHECK(agent.placement.releases[uuid] == 1);
  CHECK(agent.placement.held_on(uuid).empty());
  CHECK_FALSE(agent.etcd->find(agent.work_key()));
  CHECK_FALSE(agent.record());
}

TEST_CASE("after a restart a running guest recorded ACTIVE is adopted, not built again") {
  Agent agent;
  agent.put_work(PowerState::running);
  InstanceRecord active = agent.parts.recorder.make(*decode_work(agent.etcd->find(agent.work_key())->value),
                                              InstanceState::active);
  agent.etcd->put_now(agent.ctx.keys.instance(uuid), encode(active));
  agent.hypervisor().set(uuid, FakeVirt::Domain{DomainState::running, StopCause::unknown, {}});
  const int txns = agent.etcd->txns;
  REQUIRE(agent.list());
  REQUIRE(agent.run_until([&] { return agent.instances.find(uuid) && agent.settled(); }));
  CHECK(agent.instances.find(uuid)->phase() == Phase::active);
  CHECK(agent.hypervisor().creates() == 0);
  CHECK(agent.etcd->txns == txns);
}

TEST_CASE("an ERROR recorded before a restart is never built again; what it holds is given back once") {
  Agent agent;
  agent.put_work(PowerState::running);
  InstanceRecord failed = agent.parts.recorder.make(*decode_work(agent.etcd->find(agent.work_key())->value),
                                              InstanceState::error);
  failed.error_code = "launch_failure";
  failed.releasing = true;
  agent.etcd->put_now(agent.ctx.keys.instance(uuid), encode(failed));
  REQUIRE(agent.list());
  REQUIRE(agent.run_until([&] { return agent.instances.find(uuid) && agent.instances.find(uuid)->phase() == Phase::released && agent.settled(); }));
  CHECK(agent.hypervisor().creates() == 0);
  CHECK(agent.placement.releases[uuid] == 1);
  REQUIRE(agent.record());
  CHECK(agent.record()->state == InstanceState::error);
  CHECK_FALSE(agent.record()->releasing);
}

TEST_CASE("a build libvirt refuses, with no attempts left, ends in ERROR holding nothing") {
  Agent agent;
  agent.hypervisor().fail_next_create(errc::launch_failure);
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::error) && !agent.record()->releasing && agent.settled(); }));
  CHECK(agent.record()->error_code == "no_valid_host");
  CHECK(agent.placement.releases[uuid] == 1);
  CHECK_FALSE(agent.hypervisor().domain(uuid));
  CHECK(agent.instances.find(uuid)->phase() == Phase::released);
}

TEST_CASE("a release Placement refuses is retried; the keys stay until it is done") {
  Agent agent;
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  agent.placement.down = true;
  const int calls = agent.placement.calls;
  agent.put_work(PowerState::deleted);
  REQUIRE(agent.run_until([&] { return agent.placement.calls > calls; }));
  CHECK(agent.etcd->find(agent.work_key()));  // nothing removed while the allocation is held
  agent.placement.down = false;
  REQUIRE(agent.run_until([&] { return !agent.instances.find(uuid); }));
  CHECK(agent.placement.releases[uuid] == 1);
  CHECK_FALSE(agent.etcd->find(agent.work_key()));
}

TEST_CASE("an address found for a guest is recorded by its instance, once etcd takes it") {
  Agent agent;
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  agent.etcd->down = true;
  agent.instances.find(uuid)->tell(news::AddressFound{"192.0.2.7"});
  REQUIRE(agent.run_until([&] { return agent.etcd->unanswered > 1; }));
  CHECK(agent.record()->ip.empty());
  agent.etcd->down = false;
  REQUIRE(agent.run_until([&] { return agent.record()->ip == "192.0.2.7" && agent.settled(); }));
  CHECK(agent.instances.find(uuid)->ip() == "192.0.2.7");
}

TEST_CASE("an etcd out of reach holds a build back; it is recorded once etcd answers") {
  Agent agent;
  agent.put_work(PowerState::running);
  agent.deliver();
  agent.etcd->down = true;
  // Whether its host was disabled meanwhile goes unanswered: nothing is made, and the step is
  // retried.
  REQUIRE(agent.run_until([&] { return agent.etcd->unanswered > 1; }));
  CHECK(agent.hypervisor().creates() == 0);
  CHECK_FALSE(agent.record());
  agent.etcd->down = false;
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  CHECK(agent.hypervisor().domain(uuid)->state == DomainState::running);
}

TEST_CASE("once the disable's follower has heard, a build asks it, not etcd") {
  Agent agent;
  asio::co_spawn(agent.io, agent.parts.maintenance.load(), asio::detached);
  REQUIRE(agent.run_until([&] { return agent.parts.maintenance.disabled() == false; }));
  agent.put_work(PowerState::running);
  agent.deliver();
  agent.etcd->down = true;
  // Nothing to read first: the domain is made, and recorded once etcd answers.
  REQUIRE(agent.run_until([&] { return agent.hypervisor().creates() == 1; }));
  CHECK_FALSE(agent.record());
  agent.etcd->down = false;
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
}

TEST_CASE("a listing older than a watch event does not undo it") {
  Agent agent;
  agent.put_work(PowerState::running);
  const KeyValue old = *agent.etcd->find(agent.work_key());
  agent.put_work(PowerState::stopped);
  agent.deliver();
  RangeResult stale;
  stale.revision = old.mod_revision;
  stale.kvs.push_back(old);
  asio::co_spawn(agent.io, agent.instances.apply_listing(stale), asio::detached);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::stopped) && agent.settled(); }));
  CHECK(agent.instances.find(uuid)->work()->power == PowerState::stopped);
  CHECK(agent.hypervisor().domain(uuid)->state == DomainState::stopped);
}

TEST_CASE("a domain without work is destroyed") {
  Agent agent;
  agent.hypervisor().set(uuid, FakeVirt::Domain{DomainState::running, StopCause::unknown, {}});
  REQUIRE(agent.list());
  REQUIRE(agent.run_until([&] { return !agent.hypervisor().domain(uuid); }));
  REQUIRE(agent.run_until([&] { return !agent.instances.find(uuid); }));
}

// Placement: the migration consumer holds nothing any more (the books are back).
void books_already_back(Agent& agent) { agent.placement.consumers.clear(); }

TEST_CASE("a cold move undone after this host lost its guest ends, and the guest is made again") {
  Agent agent;
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  books_already_back(agent);
  // Its libvirt lost the domain (a restart of the test driver, a host that lost its disks)
  // while a cold move of it was being undone.
  agent.hypervisor().destroy(uuid);
  MoveRecord move{.instance = uuid,
                  .migration = "11111111-2222-4333-8444-555555555555",
                  .source = host,
                  .destination = "5b9c3e5e-8d7e-4a57-9d36-2f0d4a9c0002",
                  .kind = MoveKind::cold,
                  .state = MoveState::reverting,
                  .started_at = 1,
                  .error = "cannot reach its destination"};
  agent.etcd->put_now(agent.ctx.keys.move(uuid), encode(move));
  REQUIRE(agent.run_until([&] { return !agent.etcd->find(agent.ctx.keys.move(uuid)); }));
  REQUIRE(agent.run_until([&] {
    auto domain = agent.hypervisor().domain(uuid);
    return domain && domain->state == DomainState::running;
  }));
  CHECK(agent.hypervisor().creates() == 2);
}

TEST_CASE("a guest a move left paused runs again") {
  Agent agent;
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  agent.hypervisor().set(uuid, FakeVirt::Domain{DomainState::paused, StopCause::unknown, {}});
  agent.instances.observe(uuid, false);
  REQUIRE(agent.run_until([&] { return agent.hypervisor().domain(uuid)->state == DomainState::running; }));
  CHECK(agent.hypervisor().creates() == 1);
}

TEST_CASE("a live send libvirt could not finish asks the destination, and the guest runs again when it is undone") {
  Agent agent;
  agent.put_work(PowerState::running);
  REQUIRE(agent.run_until([&] { return agent.recorded(InstanceState::active) && agent.settled(); }));
  books_already_back(agent);
  // Its libvirt died after sending the guest, before it knew whether the destination runs it.
  agent.hypervisor().set(uuid, FakeVirt::Domain{DomainState::paused, StopCause::unknown, {}});
  const std::string destination = "5b9c3e5e-8d7e-4a57-9d36-2f0d4a9c0002";
  agent.etcd->put_now(agent.ctx.keys.host(destination), "{}");
  MoveRecord move{.instance = uuid, .migration = "11111111-2222-4333-8444-555555555555", .source = host,
                  .destination = destination, .kind = MoveKind::live, .state = MoveState::ready,
                  .started_at = unix_millis(), .libvirt_uri = "qemu+tcp://b/system",
                  .migration_uri = "tcp://b", .domain_xml = "<domain/>"};
  agent.etcd->put_now(agent.ctx.keys.move(uuid), encode(move));
  auto state = [&] {
    auto found = agent.etcd->find(agent.ctx.keys.move(uuid));
    auto move = found ? decode_move(found->value) : result<MoveRecord>(Error(errc::not_found, "gone"));
    return move ? std::optional(move->state) : std::nullopt;
  };
  auto domain = [&] {
    auto found = agent.hypervisor().domain(uuid);
    return found ? std::optional(found->state) : std::nullopt;
  };
  REQUIRE(agent.run_until([&] { return state() == MoveState::left_source; }));
  CHECK(domain() == DomainState::paused);  // nothing runs until it is known where
  // The destination has no copy: it undoes the move.
  move.state = MoveState::reverting;
  move.error = "its guest is on neither host";
  agent.etcd->put_now(agent.ctx.keys.move(uuid), encode(move));
  REQUIRE(agent.run_until([&] { return !state() && domain() == DomainState::running; }));
  CHECK(agent.hypervisor().creates() == 1);
}

TEST_CASE("a switch-over of a resize in place that etcd did not answer is read back by its move record, "
          "never by the work key it rewrites") {
  Agent agent;
  WorkSpec spec;
  spec.uuid = uuid;
  spec.query = "resources=VCPU:1";
  spec.resources = {{"VCPU", 1}};
  agent.etcd->put_now(agent.work_key(), encode(spec));
  spec.power = PowerState::stopped;  // a second write: the key has been written before
  agent.etcd->put_now(agent.work_key(), encode(spec));
  MoveRecord move{.instance = uuid, .migration = "7387cdc8-291c-4b02-87ce-895f460b7a81", .source = host,
                  .destination = host, .kind = MoveKind::resize, .state = MoveState::claimed,
                  .query = "resources=VCPU:2"};
  const int64_t asked = agent.etcd->put_now(agent.ctx.keys.move(uuid), encode(move)).kv.mod_revision;
  move.abort = true;  // changed meanwhile (an operator aborted it): the switch-over's guard fails
  agent.etcd->put_now(agent.ctx.keys.move(uuid), encode(move));
  const std::string before = agent.etcd->find(agent.work_key())->value;
  agent.etcd->lost_txns = 1;  // the refusal's answer is lost: what etcd holds tells
  std::optional<result<std::optional<int64_t>>> switched;
  auto switch_over = [&]() -> awaitable<void> { switched = co_await agent.parts.mover.switch_over(move, asked, {}); };
  asio::co_spawn(agent.io, switch_over(), asio::detached);
  REQUIRE(agent.run_until([&] { return switched.has_value(); }, 20s));
  REQUIRE(*switched);
  CHECK_FALSE(switched->value().has_value());  // refused: not taken for committed
  CHECK(agent.etcd->find(agent.work_key())->value == before);
  // The aborted move is undone by the instance meanwhile, or still there: never switched.
  const KeyValue* left = agent.etcd->find(agent.ctx.keys.move(uuid));
  CHECK((!left || decode_move(left->value)->state != MoveState::switched));
}
