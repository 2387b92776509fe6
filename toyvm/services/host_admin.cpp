// toyvm host disable / enable: take a host out of service and bring it back. The operator's
// intent is a key of its own in etcd, outside any lease; the host's agent follows it (the
// host record says DISABLED, the provider carries COMPUTE_STATUS_DISABLED) and keeps it
// across restarts. Disabling also sets the trait here, for a host whose agent is not
// running; enabling leaves the trait to the agent, the only one that takes it off.
//
// toyvm host drain: the host disabled, then each of its instances moved to another host
// (services/move_request.hpp), a few at a time, until nothing is on it or on its way to it
// (model/drain.hpp decides); it says what stayed and why.
//
// toyvm evacuate: Nova's evacuate for a dead host (no agent holds its lease). Each instance
// is rebuilt on another live host from its image with a fresh disk: its allocation moves in
// one Placement step, then its work moves in one etcd transaction guarded by the work's
// revision and by the host still being dead. An agent that comes back finds no work for
// those guests and removes their domains, leaving the allocations where they now are.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "model/keys.hpp"
#include "model/drain.hpp"
#include "model/moves.hpp"
#include "model/records.hpp"
#include "services/common.hpp"
#include "services/move_request.hpp"
#include "services/placer.hpp"
#include "services/services.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>

namespace toyvm {
namespace {

class HostAdmin {
 public:
  HostAdmin(asio::io_context& io, const Config& config, const HostOptions& options)
      : options_(options),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        placement_(io.get_executor(), config.placement),
        placer_(placement_, *etcd_, config) {}

  awaitable<int> run() {
    // A name (the agent's --name, Placement's provider name) or the provider's uuid.
    auto resolved = co_await resolve_host(placement_, options_.host);
    if (!resolved) co_return report_failure(resolved.error());
    const std::string provider = *resolved;
    switch (options_.action) {
      case HostOptions::Action::disable: co_return co_await disable(provider);
      case HostOptions::Action::enable: co_return co_await enable(provider);
      case HostOptions::Action::evacuate: co_return co_await evacuate(provider);
      case HostOptions::Action::drain: co_return co_await drain(provider);
    }
    co_return 0;
  }

 private:
  awaitable<int> disable(const std::string& provider) {
    HostMaintenance maintenance{options_.reason, unix_seconds()};
    auto put = co_await etcd_->put(keys_.disabled(provider), encode(maintenance));
    if (!put) co_return etcd_failure(*etcd_, put.error());
    // Traits its agent registers meanwhile stay: only this one is added, under the generation
    // read with the rest.
    if (auto marked = co_await placement_.add_trait(provider, std::string(disabled_trait)); !marked)
      co_return report_failure(marked.error());
    std::printf("DISABLED HOST %s (%s)\n", options_.host.c_str(), provider.c_str());
    co_return 0;
  }

  awaitable<int> enable(const std::string& provider) {
    auto erased = co_await etcd_->erase(keys_.disabled(provider));
    if (!erased) co_return etcd_failure(*etcd_, erased.error());
    auto alive = co_await etcd_->range(keys_.host(provider));
    if (!alive) co_return etcd_failure(*etcd_, alive.error());
    if (alive->kvs.empty())
      std::fprintf(stderr, "toyvm: host %s has no running agent: it takes work once its agent starts\n",
                   options_.host.c_str());
    std::printf("ENABLED HOST %s (%s)\n", options_.host.c_str(), provider.c_str());
    co_return 0;
  }

  // Disables the host, then looks at it until nothing is left there or on its way: each running
  // or stopped guest is moved (`--parallel` at once), and what is still coming or going (a
  // schedule whose claim has not been handed over, a move heading here, a build, a destroy) is
  // waited for, up to the timeout. A schedule or move that meets the disabled host at its
  // hand-over goes elsewhere; one that got there first is moved once it has landed.
  awaitable<int> drain(const std::string& provider) {
    if (int code = co_await disable(provider)) co_return code;
    MoveRequests moves(*etcd_, placer_, keys_);
    auto executor = co_await asio::this_coro::executor;
    asio::steady_timer wake(executor);
    std::deque<std::string> queue;
    std::set<std::string> busy, stays;
    std::map<std::string, std::chrono::steady_clock::time_point> waiting;  // on its way, since
    int moved = 0, workers = 0;
    auto worker = [&]() -> awaitable<void> {
      while (!queue.empty()) {
        const std::string uuid = queue.front();
        queue.pop_front();
        auto ended = co_await move_one(moves, uuid);
        if (ended) {
          std::printf("MOVED INSTANCE %s TO %s\n", uuid.c_str(), ended->c_str());
          ++moved;
        } else {
          std::printf("STAYED INSTANCE %s: %s\n", uuid.c_str(), ended.error().message().c_str());
          stays.insert(uuid);
        }
        std::fflush(stdout);
        busy.erase(uuid);
        wake.cancel();
      }
    };
    const auto patience = std::chrono::duration_cast<std::chrono::steady_clock::duration>(options_.move_timeout);
    auto seen = std::chrono::steady_clock::now();  // when etcd and Placement last answered
    bool blind = false;  // they did not answer for too long: what is there is not known
    while (true) {
      auto look = co_await look_at(provider);
      const auto now = std::chrono::steady_clock::now();
      if (!look) {
        // Not looked at is not empty: nothing is said gone, and the moves under way go on.
        spdlog::warn("drain: looking at host {}: {}; looking again", options_.host, look.error().message());
        if (now - seen >= patience && !blind) {
          std::fprintf(stderr, "toyvm: host %s could not be looked at for %g s: %s\n", options_.host.c_str(),
                       in_seconds(options_.move_timeout), look.error().message().c_str());
          blind = true;
        }
        if (blind && busy.empty()) break;
        wake.expires_after(std::chrono::seconds(1));
        co_await wake.async_wait(asio::as_tuple(use_awaitable));
        continue;
      }
      seen = now;
      blind = false;
      DrainStep step = plan_drain(*look, busy);
      for (const auto& [uuid, why] : step.stay)
        if (stays.insert(uuid).second) std::printf("STAYED INSTANCE %s: %s\n", uuid.c_str(), why.c_str());
      for (const std::string& uuid : step.move) {
        if (stays.count(uuid)) continue;  // its move was undone: it is not asked again
        busy.insert(uuid);
        queue.push_back(uuid);
      }
      std::map<std::string, std::chrono::steady_clock::time_point> still;
      for (const auto& [what, why] : step.wait) {
        auto [since, fresh] = waiting.emplace(what, now);
        if (fresh) std::printf("WAITING FOR %s: %s\n", what.c_str(), why.c_str());
        if (stays.count(what)) continue;
        if (now - since->second < patience) {
          still.emplace(what, since->second);
        } else {
          std::printf("STAYED INSTANCE %s: %s, after %g s\n", what.c_str(), why.c_str(),
                      in_seconds(options_.move_timeout));
          stays.insert(what);
        }
      }
      for (const auto& [what, since] : waiting)
        if (!still.count(what) && !stays.count(what) && !busy.count(what))
          std::printf("GONE %s: no longer on its way to or from the host\n", what.c_str());
      waiting = std::move(still);
      std::fflush(stdout);
      for (; workers < options_.parallel && !queue.empty(); ++workers)
        asio::co_spawn(executor, worker(), [&](std::exception_ptr) {
          --workers;
          wake.cancel();
        });
      if (waiting.empty() && busy.empty()) break;
      wake.expires_after(std::chrono::seconds(1));
      co_await wake.async_wait(asio::as_tuple(use_awaitable));
    }
    while (workers > 0) {  // each has ended its last move; its completion is on its way
      wake.expires_after(std::chrono::seconds(1));
      co_await wake.async_wait(asio::as_tuple(use_awaitable));
    }
    std::printf("DRAINED HOST %s (%s): %d moved, %zu stayed\n", options_.host.c_str(), provider.c_str(), moved,
                stays.size());
    co_return stays.empty() && !blind ? 0 : int(ExitCode::failed);
  }

  // The host's work with its instances' states, every move from or to it, and every consumer
  // holding resources on its provider.
  awaitable<result<DrainLook>> look_at(const std::string& provider) {
    DrainLook look;
    auto works = co_await etcd_->range_prefix(keys_.work_prefix(provider));
    if (!works) co_return works.error();
    for (const KeyValue& kv : works->kvs) {
      auto uuid = keys_.parse_work(kv.key);
      if (!uuid) continue;
      DrainLook::Guest guest;
      guest.uuid = uuid->instance;
      auto work = decode_work(kv.value);
      guest.readable = work.has_value();
      if (work) guest.power = work->power;
      auto recorded = co_await etcd_->range(keys_.instance(uuid->instance));
      if (!recorded) co_return recorded.error();
      if (!recorded->kvs.empty())
        if (auto record = decode_instance(recorded->kvs.front().value)) guest.state = record->state;
      look.guests.push_back(std::move(guest));
    }
    auto in_flight = co_await etcd_->range_prefix(keys_.moves_prefix());
    if (!in_flight) co_return in_flight.error();
    for (const KeyValue& kv : in_flight->kvs)
      if (auto move = decode_move(kv.value); move && (move->source == provider || move->destination == provider))
        look.moves.push_back(std::move(*move));
    auto held = co_await placement_.provider_allocations(provider);
    if (!held) co_return held.error();
    for (const auto& [consumer, amounts] : *held) look.consumers.push_back(consumer);
    look.host = provider;
    co_return look;
  }

  // One instance asked to move and followed to its end: where it went, or why it stayed. A
  // running one moves live, a stopped one cold. A move that was undone is asked once more, cold
  // (the guest runs on where it was meanwhile): the host is to be emptied, and a guest that
  // cannot move live (its CPU, its disk, its dirty rate) still moves powered off.
  awaitable<result<std::string>> move_one(MoveRequests& moves, std::string uuid) {
    for (bool cold : {false, true}) {
      auto asked = co_await moves.ask(uuid, "", cold);
      if (!asked) co_return asked.error();
      std::printf("MOVING INSTANCE %s TO %s%s\n", uuid.c_str(), asked->move.destination.c_str(),
                  asked->move.kind == MoveKind::live ? "" : " (cold)");
      std::fflush(stdout);
      auto ended = co_await moves.follow(*asked, options_.move_timeout);
      if (!ended) co_return ended.error();
      if (ended->moved) co_return ended->host;
      if (asked->move.kind != MoveKind::live) co_return Error(errc::changed, ended->error);
      std::printf("UNDONE INSTANCE %s: %s; asking again, cold\n", uuid.c_str(), ended->error.c_str());
    }
    co_return Error(errc::changed, "not moved");
  }

  awaitable<int> evacuate(const std::string& provider) {
    auto alive = co_await etcd_->range(keys_.host(provider));
    if (!alive) co_return etcd_failure(*etcd_, alive.error());
    if (!alive->kvs.empty())
      co_return report_failure(ExitCode::failed,
                               fmt::format("host {} is alive (its agent holds its lease): only a dead host is "
                                           "evacuated; stop its agent first, or `toyvm host disable` it",
                                           options_.host));
    auto works = co_await etcd_->range_prefix(keys_.work_prefix(provider));
    if (!works) co_return etcd_failure(*etcd_, works.error());
    int no_room = 0, changed = 0;
    for (const KeyValue& kv : works->kvs) {
      auto work = decode_work(kv.value);
      if (!work) {
        std::fprintf(stderr, "toyvm: %s holds a corrupt record; left as it is\n", kv.key.c_str());
        continue;
      }
      auto held = co_await etcd_->range(keys_.instance(work->uuid));
      if (!held) co_return etcd_failure(*etcd_, held.error());
      bool failed = false;
      if (!held->kvs.empty()) {
        auto record = decode_instance(held->kvs.front().value);
        failed = record && record->state == InstanceState::error;
      }
      auto settled = co_await end_move_of_dead(*work);
      if (!settled) {
        if (is_etcd_error(settled.error())) co_return etcd_failure(*etcd_, settled.error());
        co_return report_failure(settled.error());
      }
      if (!*settled) {
        ++changed;
        continue;
      }
      // ERROR holds nothing to move, and a destroyed one should not come back.
      if (work->power == PowerState::deleted || failed) {
        std::fprintf(stderr, "toyvm: instance %s is %s; left on the host (`toyvm destroy --force` removes it)\n",
                     work->uuid.c_str(), work->power == PowerState::deleted ? "being destroyed" : "ERROR");
        continue;
      }
      auto moved = co_await evacuate_one(provider, *work, kv.mod_revision);
      if (!moved) {
        if (is_etcd_error(moved.error())) co_return etcd_failure(*etcd_, moved.error());
        co_return report_failure(moved.error());
      }
      switch (moved->outcome) {
        case Relocated::Outcome::moved:
          std::printf("EVACUATED INSTANCE %s TO %s\n", work->uuid.c_str(), moved->host.c_str());
          break;
        case Relocated::Outcome::no_room:
          std::printf("NO ALLOCATIONS LEFT FOR INSTANCE %s\n", work->uuid.c_str());
          ++no_room;
          break;
        case Relocated::Outcome::lost_race:
        case Relocated::Outcome::put_back:
          if (moved->unknown.code) co_return etcd_failure(*etcd_, moved->unknown);
          std::fprintf(stderr,
                       "toyvm: instance %s changed while it was evacuated (stopped, started, destroyed, moved by "
                       "another evacuation, or its host came back); left\n",
                       work->uuid.c_str());
          ++changed;
          break;
        case Relocated::Outcome::stranded:
          std::fprintf(stderr,
                       "toyvm: instance %s stays on its host, but its allocation could not be put back from %s "
                       "(toyvm audit: allocation_elsewhere)\n",
                       work->uuid.c_str(), moved->host.c_str());
          ++changed;
          break;
      }
      std::fflush(stdout);
    }
    // Guests on their way here have their work on their source still: its agent ends each such
    // move once this host has been dead for a lease (the work follows a guest that left, and
    // this evacuation, asked again, moves it on), or an evacuation of that host does.
    auto heading = co_await etcd_->range_prefix(keys_.moves_prefix());
    if (!heading) co_return etcd_failure(*etcd_, heading.error());
    for (const KeyValue& kv : heading->kvs) {
      auto move = decode_move(kv.value);
      if (!move || move->destination != provider || move->source == provider) continue;
      std::fprintf(stderr,
                   "toyvm: instance %s was moving here from host %s; that host's agent ends the move (evacuate "
                   "again once it has)\n",
                   move->instance.c_str(), move->source.c_str());
      ++changed;
    }
    if (changed > 0) co_return int(ExitCode::failed);
    co_return no_room > 0 ? int(ExitCode::no_allocations) : 0;
  }

  // A move of a guest whose host died, ended as its source would (decide_move, standing in for
  // it): one that had not sent the guest yet is undone (the guest is gone with its host); for one
  // that may have, the destination is asked whether it runs there (left_source), and the move is
  // left to it. true: no move (any more), evacuate it.
  awaitable<result<bool>> end_move_of_dead(const WorkSpec& work) {
    const std::string key = keys_.move(work.uuid);
    auto moving = co_await etcd_->range(key);
    if (!moving) co_return moving.error();
    if (moving->kvs.empty()) co_return true;
    const int64_t revision = moving->kvs.front().mod_revision;
    auto move = decode_move(moving->kvs.front().value);
    if (!move) {
      std::fprintf(stderr, "toyvm: instance %s has a move record that cannot be read; left\n", work.uuid.c_str());
      co_return false;
    }
    std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(key, revision)};
    const char* ended = nullptr;
    switch (decide_move(dead_source_view(*move))) {
      // Nothing of the guest is left on its host to run again: undone is unwound at once.
      case MoveAction::revert:
      case MoveAction::unwind: {
        auto reverted = co_await placer_.revert_move(work.uuid, move->migration);
        if (!reverted) co_return reverted.error();
        ended = "undone";
        break;
      }
      case MoveAction::settle: {
        auto settled = co_await placer_.finish_move(move->migration);
        if (!settled) co_return settled.error();
        ended = "settled";
        break;
      }
      case MoveAction::left: {
        move->state = MoveState::left_source;
        std::vector<EtcdOp> asked{EtcdOp::put(key, encode(*move))};
        auto txn = co_await etcd_->txn(std::move(as_read), std::move(asked));
        if (!txn) co_return txn.error();
        break;
      }
      default: break;  // the destination's turn
    }
    if (ended) {
      std::vector<EtcdOp> gone{EtcdOp::erase(key)};
      auto txn = co_await etcd_->txn(std::move(as_read), std::move(gone));
      if (!txn) co_return txn.error();
      if (txn->succeeded) std::fprintf(stderr, "toyvm: instance %s: its move was %s\n", work.uuid.c_str(), ended);
      co_return txn->succeeded;
    }
    std::fprintf(stderr,
                 "toyvm: instance %s was moving to %s when its host died; that host finishes or undoes the move "
                 "(evacuate again once it has)\n",
                 work.uuid.c_str(), move->destination.c_str());
    co_return false;
  }

  // Off the dead host by the placer (relocate), guarded by the work's revision
  // and by the host staying dead (an agent that comes back takes its work up again).
  awaitable<result<Relocated>> evacuate_one(const std::string& provider, WorkSpec work, int64_t revision) {
    Relocation move;
    move.work = std::move(work);
    move.work.attempt = 1;
    InstanceRecord record;
    record.uuid = move.work.uuid;
    record.name = move.work.name;
    record.updated_at = unix_millis();
    move.from = provider;
    move.work_revision = revision;
    move.also_require = {EtcdCompare::absent(keys_.host(provider))};
    move.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    co_return co_await placer_.relocate(std::move(move), std::move(record));
  }

  const HostOptions& options_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  PlacementClient placement_;
  Placer placer_;
};

}  // namespace

int run_host(const Config& config, const HostOptions& options) {
  return run_on_loop([&](asio::io_context& io) -> awaitable<int> {
    HostAdmin admin(io, config, options);
    co_return co_await admin.run();
  });
}

}  // namespace toyvm
