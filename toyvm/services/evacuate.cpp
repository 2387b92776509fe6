// toyvm evacuate: Nova's evacuate for a dead host (no agent holds its lease). Each instance
// is rebuilt on another live host from its image with a fresh disk: its allocation moves in
// one Placement step, then its work moves in one etcd transaction guarded by the work's
// revision and by the host still being dead. An agent that comes back finds no work for
// those guests and removes their domains, leaving the allocations where they now are.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "model/keys.hpp"
#include "model/moves.hpp"
#include "model/records.hpp"
#include "services/common.hpp"
#include "services/move_request.hpp"
#include "services/placer.hpp"
#include "services/services.hpp"

#include <cstdio>

namespace toyvm {
namespace {

class Evacuation {
 public:
  Evacuation(asio::io_context& io, const Config& config, std::string host, Say& say)
      : host_(std::move(host)),
        say_(say),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        placement_(io.get_executor(), config.placement),
        placer_(placement_, *etcd_, config) {}

  awaitable<Outcome> run() {
    auto resolved = co_await resolve_host(placement_, host_);
    if (!resolved) co_return resolved.error();
    co_return co_await evacuate(*resolved);
  }

 private:
  awaitable<Outcome> evacuate(const std::string& provider) {
    auto alive = co_await etcd_->range(keys_.host(provider));
    if (!alive) co_return etcd_error(*etcd_, alive.error());
    if (!alive->kvs.empty())
      co_return Error(errc::changed, fmt::format("host {} is alive (its agent holds its lease): only a dead host is "
                                                 "evacuated; stop its agent first, or `toyvm host disable` it",
                                                 host_));
    auto works = co_await etcd_->range_prefix(keys_.work_prefix(provider));
    if (!works) co_return etcd_error(*etcd_, works.error());
    int no_room = 0, changed = 0;
    for (const KeyValue& kv : works->kvs) {
      auto work = decode_work(kv.value);
      if (!work) {
        say_.note(fmt::format("{} holds a corrupt record; left as it is", kv.key));
        continue;
      }
      auto held = co_await etcd_->range(keys_.instance(work->uuid));
      if (!held) co_return etcd_error(*etcd_, held.error());
      bool failed = false;
      if (!held->kvs.empty()) {
        auto record = decode_instance(held->kvs.front().value);
        failed = record && record->state == InstanceState::error;
      }
      auto settled = co_await end_move_of_dead(*work);
      if (!settled) co_return with_endpoints(*etcd_, settled.error());
      if (!*settled) {
        ++changed;
        continue;
      }
      // ERROR holds nothing to move, and a destroyed one should not come back.
      if (work->power == PowerState::deleted || failed) {
        say_.note(fmt::format("instance {} is {}; left on the host (`toyvm destroy --force` removes it)", work->uuid,
                              work->power == PowerState::deleted ? "being destroyed" : "ERROR"));
        continue;
      }
      auto moved = co_await evacuate_one(provider, *work, kv.mod_revision);
      if (!moved) co_return with_endpoints(*etcd_, moved.error());
      switch (moved->outcome) {
        case Relocated::Outcome::moved:
          say_.line(fmt::format("EVACUATED INSTANCE {} TO {}", work->uuid, moved->host));
          break;
        case Relocated::Outcome::no_room:
          say_.line(fmt::format("NO ALLOCATIONS LEFT FOR INSTANCE {}", work->uuid));
          ++no_room;
          break;
        case Relocated::Outcome::lost_race:
        case Relocated::Outcome::put_back:
          if (moved->unknown.code) co_return etcd_error(*etcd_, moved->unknown);
          say_.note(fmt::format("instance {} changed while it was evacuated (stopped, started, destroyed, moved by "
                                "another evacuation, or its host came back); left",
                                work->uuid));
          ++changed;
          break;
        case Relocated::Outcome::stranded:
          say_.note(fmt::format("instance {} stays on its host, but its allocation could not be put back from {} "
                                "(toyvm audit: allocation_elsewhere)",
                                work->uuid, moved->host));
          ++changed;
          break;
      }
    }
    // Guests on their way here have their work on their source still: its agent ends each such
    // move once this host has been dead for a lease (the work follows a guest that left, and
    // this evacuation, asked again, moves it on), or an evacuation of that host does.
    auto heading = co_await etcd_->range_prefix(keys_.moves_prefix());
    if (!heading) co_return etcd_error(*etcd_, heading.error());
    for (const KeyValue& kv : heading->kvs) {
      auto move = decode_move(kv.value);
      if (!move || move->destination != provider || move->source == provider) continue;
      say_.note(fmt::format("instance {} was moving here from host {}; that host's agent ends the move (evacuate "
                            "again once it has)",
                            move->instance, move->source));
      ++changed;
    }
    // What was left, and why, is said above.
    if (changed > 0) co_return ExitCode::failed;
    co_return no_room > 0 ? ExitCode::no_allocations : ExitCode::ok;
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
      say_.note(fmt::format("instance {} has a move record that cannot be read; left", work.uuid));
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
      if (txn->succeeded) say_.note(fmt::format("instance {}: its move was {}", work.uuid, ended));
      co_return txn->succeeded;
    }
    say_.note(fmt::format("instance {} was moving to {} when its host died; that host finishes or undoes the move "
                          "(evacuate again once it has)",
                          work.uuid, move->destination));
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
    record.project = move.work.project;
    record.updated_at = unix_millis();
    move.from = provider;
    move.work_revision = revision;
    move.also_require = {EtcdCompare::absent(keys_.host(provider))};
    move.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    co_return co_await placer_.relocate(std::move(move), std::move(record));
  }

  const std::string host_;  // as the operator named it
  Say& say_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  PlacementClient placement_;
  Placer placer_;
};

}  // namespace

Outcome run_evacuate(const Config& config, const std::string& host, Say& say) {
  return run_on_loop([&](asio::io_context& io) -> awaitable<Outcome> {
    Evacuation evacuation(io, config, host, say);
    co_return co_await evacuation.run();
  });
}

}  // namespace toyvm
