// An instance's part in moving its guest to another host, on either host, once its asker has
// claimed the destination (or not in time: the source undoes it): the destination prepares for
// it, the source sends the guest while it runs (or, cold, powers it off and copies its disk),
// and whichever first sees the guest run on the destination (cold: the destination, once it
// has the disk) switches its work over; the source then settles the books, or unwinds them
// when the move does not happen (model/moves.hpp decides which). A resize on its own host is
// the source's alone: off, made its new size, switched.

#include "services/compute/instance.hpp"

#include "core/failpoint.hpp"
#include "core/metrics.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace toyvm::compute {

awaitable<std::optional<result<Next>>> Instance::step_move() {
  const MoveRecord move = *known_.move;
  const int64_t revision = known_.move_revision;
  const std::optional<WorkSpec>& desired = known_.work;
  const bool source = move.source == ctx_.host.provider;
  const bool in_place = move.source == move.destination;  // a resize on its own host
  // Switched over (its work is here now): only the settling is left, then the usual decisions.
  if (!source && desired && move.state != MoveState::switched) co_return std::nullopt;
  auto here = co_await ctx_.virt(&VirtBackend::state, uuid_);
  if (!here) co_return here.error().doing("libvirt");
  bool job = false;
  if ((move.state == MoveState::ready || move.state == MoveState::left_source) && *here != DomainState::absent) {
    auto migrating = co_await ctx_.virt(&VirtBackend::migrating, uuid_);
    if (!migrating) co_return migrating.error().doing("libvirt");
    job = *migrating;
  }
  // Every state waits on one side: a peer gone for good never answers, and this side ends it.
  auto peer = co_await peer_alive(move, source);
  if (!peer) co_return peer.error().doing("reading whether its other host has an agent");
  // A live move is of a running guest; a cold one of a guest that is still wanted, on or off.
  const bool cold = move.kind != MoveKind::live;
  const bool wanted = desired && (cold ? desired->power != PowerState::deleted : desired->power == PowerState::running);
  const auto patience = std::chrono::duration_cast<std::chrono::milliseconds>(ctx_.config.compute.move_prepare_timeout);
  const bool overdue = unix_millis() - move.started_at > patience.count();
  const MoveView view{source, move.kind, in_place, move.state, *here, job, wanted, overdue, *peer, move.abort};
  switch (decide_move(view)) {
    case MoveAction::none:
      // Waiting for the other side (which may take too long, or die), for a job of libvirt's to
      // end: looked at again in a moment, news or not.
      // (A destination whose work has not come yet decides nothing: it would remove the guest.)
      if (!source && move.state == MoveState::switched && desired) co_return std::nullopt;
      co_return Next::later;
    case MoveAction::prepare: {
      spdlog::info("instance {}: preparing for it to arrive from host {}", uuid_, move.source);
      auto ready = co_await steps_.mover.prepare(move);
      if (!ready) {
        // This host will not take it (its guest is on this libvirt already, the host was
        // disabled, its server group forbids it): undone at once, saying why. Anything else is
        // tried again; the source gives up after move_prepare_timeout.
        if (ready.error() == errc::already_exists || ready.error() == errc::no_valid_host)
          co_return co_await revert_move(move, revision, ready.error().message());
        co_return ready.error().doing("preparing for it");
      }
      co_return co_await advance_move(std::move(*ready), revision);
    }
    case MoveAction::migrate: co_return co_await migrate(move, revision);
    case MoveAction::copy: co_return co_await copy_disk(move, revision, *here);
    case MoveAction::resize_here: co_return co_await resize_here(move, revision, *here);
    case MoveAction::left: {
      MoveRecord next = move;
      next.state = MoveState::left_source;
      co_return co_await advance_move(std::move(next), revision);
    }
    case MoveAction::switch_over: co_return co_await switch_over(move, revision);
    case MoveAction::settle:
    case MoveAction::unwind: co_return co_await move_ended(move, revision);
    case MoveAction::revert: {
      std::string why = cold ? "its guest is gone from its host" : "its guest is not running";
      const std::string& other = source ? move.destination : move.source;
      if (!*peer) why = fmt::format("host {} has had no agent for {} s", other, in_seconds(ctx_.config.compute.lease_ttl));
      else if (move.abort) why = "an operator aborted it";
      else if (!source) why = "its guest is on neither host";
      else if (!wanted) why = "it was stopped or destroyed before it left";
      else if (overdue && move.state == MoveState::preparing)
        why = fmt::format("no host was claimed for it within {} s", in_seconds(ctx_.config.compute.move_prepare_timeout));
      else if (overdue && move.state == MoveState::claimed)
        why = fmt::format("host {} did not prepare for it within {} s", move.destination,
                          in_seconds(ctx_.config.compute.move_prepare_timeout));
      co_return co_await revert_move(move, revision, std::move(why));
    }
    case MoveAction::clean_up: {
      auto gone = co_await ctx_.virt(&VirtBackend::destroy, uuid_);
      if (!gone) co_return gone.error().doing("removing what was prepared for it");
      // A cold move's source powered its guest off: it ends the move itself, as only it can
      // start the guest again (or an evacuation of its dead host does).
      if (cold) co_return Next::rest;
      co_return co_await move_ended(move, revision);
    }
  }
  co_return Next::rest;
}

Step Instance::advance_move(MoveRecord next, int64_t revision) {
  auto made = co_await steps_.mover.write(next, revision);
  if (!made) co_return made.error().doing(fmt::format("recording its move as {}", to_string(next.state)));
  if (!*made) co_return Next::rest;  // it changed meanwhile, and the news is on its way
  known_.move = std::move(next);
  known_.move_revision = **made;
  co_return Next::again;
}

Step Instance::revert_move(MoveRecord move, int64_t revision, std::string why) {
  spdlog::warn("instance {}: its move to host {} does not happen: {}", uuid_, move.destination, why);
  move.state = MoveState::reverting;
  move.error = std::move(why);
  move.domain_xml.clear();
  co_return co_await advance_move(std::move(move), revision);
}

awaitable<result<bool>> Instance::peer_alive(const MoveRecord& move, bool source) {
  const std::string& other = source ? move.destination : move.source;
  if (other.empty() || other == ctx_.host.provider) co_return true;
  if (std::exchange(peer_, other) != other) peer_gone_since_.reset();  // another move, another peer
  auto alive = co_await ctx_.etcd->range(ctx_.keys.host(other));
  if (!alive) co_return alive.error();
  const auto now = std::chrono::steady_clock::now();
  if (!alive->kvs.empty()) {
    peer_gone_since_.reset();
    co_return true;
  }
  // Its lease lapsed (or it stopped cleanly): a restart takes it again within a lease's time.
  if (!peer_gone_since_) peer_gone_since_ = now;
  co_return now - *peer_gone_since_ < ctx_.config.compute.lease_ttl;
}

void Instance::abort_sending(std::string_view why) {
  if (sending_->abort_asked) return;
  sending_->abort_asked = true;
  spdlog::warn("instance {}: ending its live move: {}", uuid_, why);
  auto abort = [](std::shared_ptr<Instance> self) -> awaitable<void> {
    auto ended = co_await self->ctx_.virt(&VirtBackend::abort_migration, self->uuid_);
    if (!ended) spdlog::error("instance {}: aborting its live move: {}", self->uuid_, ended.error().message());
  };
  spawn_detached(ctx_.io, abort(shared_from_this()), "aborting a live move");
}

Step Instance::migrate(MoveRecord move, int64_t revision) {
  spdlog::info("instance {}: moving to host {} while it runs", uuid_, move.destination);
  const auto patience = completion_timeout(known_.work ? known_.work->resources : ResourceAmounts{},
                                           ctx_.config.compute.live_migration_completion_timeout);
  sending_.emplace();
  auto sent = co_await steps_.mover.send(move, patience);
  sending_.reset();
  steps_.presence.publish(uuid_);
  if (!sent) {
    spdlog::error("instance {}: moving to host {}: {}", uuid_, move.destination, sent.error().message());
    // libvirt leaves the guest running here when a move fails; only then does it revert. A
    // guest gone from here, or a job still running, is looked at again.
    auto here = co_await ctx_.virt(&VirtBackend::state, uuid_);
    auto job = co_await ctx_.virt(&VirtBackend::migrating, uuid_);
    if (here && *here == DomainState::running && job && !*job) {
      // A libvirt daemon that has just started refuses migrations until it has probed QEMU
      // ("could not get preferred machine"): a send refused for now is asked again, a moment
      // apart, for up to move_prepare_timeout before the move is undone. One aborted, timed
      // out or that this libvirt can never make is undone at once.
      const auto now = std::chrono::steady_clock::now();
      if (!send_refused_ || send_refused_->migration != move.migration) send_refused_ = SendRefused{move.migration, now};
      if (sent.error() == errc::not_ready && now - send_refused_->since < ctx_.config.compute.move_prepare_timeout)
        co_return Next::later;
      co_return co_await revert_move(std::move(move), revision, sent.error().message());
    }
    co_return Next::later;
  }
  send_refused_.reset();
  spdlog::info("instance {}: runs on host {} after {} ms (paused {} ms, {} MiB sent)", uuid_, move.destination,
               sent->total_ms, sent->downtime_ms, sent->bytes >> 20);
  metrics::observe("toyvm_move_seconds", double(sent->total_ms) / 1000.0);
  co_return co_await switch_over(std::move(move), revision);
}

Step Instance::copy_disk(MoveRecord move, int64_t revision, DomainState here) {
  spdlog::info("instance {}: moving to host {} while off", uuid_, move.destination);
  if (auto off = co_await power_off_to_move(here); !off) co_return off.error();
  const auto started = std::chrono::steady_clock::now();
  auto copied = co_await steps_.mover.copy(move);
  if (!copied) {
    const Error failure = copied.error().doing(fmt::format("copying its disk to host {}", move.destination));
    if (copied.error() == errc::virt_unavailable) co_return failure;  // this host's libvirt: tried again
    spdlog::error("instance {}: {}", uuid_, failure.message());
    // Its own disk and domain are untouched: the move is undone, and the guest runs here again.
    co_return co_await revert_move(std::move(move), revision, copied.error().message());
  }
  const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  spdlog::info("instance {}: its disk is on host {} after {:.1f} s", uuid_, move.destination, took);
  move.state = MoveState::copied;
  co_return co_await advance_move(std::move(move), revision);
}

Step Instance::resize_here(MoveRecord move, int64_t revision, DomainState here) {
  spdlog::info("instance {}: resizing it here to {}", uuid_, move.query);
  if (auto off = co_await power_off_to_move(here); !off) co_return off.error();
  auto made = co_await steps_.mover.resize_here(move);
  if (!made) {
    if (made.error() == errc::virt_unavailable) co_return made.error().doing("resizing it");  // tried again
    spdlog::error("instance {}: resizing it: {}", uuid_, made.error().message());
    // Undone: its old size is what it holds again (a disk that grew already stays grown).
    co_return co_await revert_move(std::move(move), revision, made.error().message());
  }
  co_return co_await switch_over(std::move(move), revision);
}

awaitable<result<void>> Instance::power_off_to_move(DomainState here) {
  if (here == DomainState::stopped) co_return result<void>{};
  if (here == DomainState::running) co_await shut_down_gracefully();  // a paused guest cannot hear it
  if (auto off = co_await ctx_.virt(&VirtBackend::stop, uuid_); !off)
    co_return off.error().doing("powering it off to move it");
  co_return result<void>{};
}

Step Instance::switch_over(MoveRecord move, int64_t revision) {
  if (move.state == MoveState::copied && move.destination == ctx_.host.provider) {
    co_await failpoint::pass("move.receive");  // the disk is here, the guest not yet defined
    auto received = co_await steps_.mover.receive(move);
    if (!received) {
      const Error failure = received.error().doing(fmt::format("taking its disk from host {}", move.source));
      if (received.error() == errc::virt_unavailable) co_return failure;
      spdlog::error("instance {}: {}", uuid_, failure.message());
      // The source still has its disk and domain: the guest goes back to them.
      co_return co_await revert_move(std::move(move), revision, received.error().message());
    }
  }
  // On the destination the guest's domain key comes with its work: whoever reads the move
  // ended finds the domain where the record says.
  std::vector<EtcdOp> domain_key;
  if (move.destination == ctx_.host.provider)
    if (auto op = steps_.presence.domain_put(uuid_)) domain_key.push_back(std::move(*op));
  auto switched = co_await steps_.mover.switch_over(move, revision, domain_key);
  if (!switched) co_return switched.error().doing(fmt::format("switching its work to host {}", move.destination));
  if (!*switched) co_return Next::rest;  // the other host switched it, or the move changed: news comes
  spdlog::info("instance {}: its work is on host {} now", uuid_, move.destination);
  if (!domain_key.empty()) steps_.presence.recorded(uuid_, domain_key.front());
  move.state = MoveState::switched;
  move.domain_xml.clear();
  const bool left_here = move.source == ctx_.host.provider && move.destination != ctx_.host.provider;
  known_.move = std::move(move);
  known_.move_revision = **switched;
  if (left_here) {
    // The work left this host in that write; the feed's news of it is older or the same.
    known_.work.reset();
    known_.work_unreadable = false;
    known_.work_revision = **switched;
  } else {
    known_.recheck_work = true;  // and arrived here (or, resized here, changed)
    // Its record too: BUILD for a guest moved powered off until it runs here again.
    known_.phase.reset();
  }
  steps_.presence.publish(uuid_);
  co_return Next::again;
}

Step Instance::move_ended(MoveRecord move, int64_t revision) {
  const bool moved = move.state == MoveState::switched;
  result<void> books;
  if (moved) books = co_await steps_.mover.settle(move);
  else books = co_await steps_.mover.unwind(move);
  if (!books) co_return books.error().doing(moved ? "settling the books of its move" : "swapping back the books of its move");
  const bool source = move.source == ctx_.host.provider;
  const bool in_place = move.source == move.destination;
  // A cold move leaves the source's copy, off, until the guest is the destination's; undone
  // (or resized here), the guest powered off for it runs again. A live move's copy is undefined
  // by libvirt once the guest runs there, and its files removed by the agent that sent it;
  // one that died meanwhile left them, and libvirt may not be done with its job yet.
  const bool left = source && moved && !in_place;
  const bool restart = source && !left && move.kind != MoveKind::live && known_.work &&
                       known_.work->power == PowerState::running;
  result<void> done;
  if (left) {
    result<bool> job = false;
    if (move.kind == MoveKind::live) job = co_await ctx_.virt(&VirtBackend::migrating, uuid_);
    if (!job) done = job.error();
    else if (*job) co_return Next::later;  // looked at again once libvirt has finished
    else done = co_await ctx_.virt(&VirtBackend::destroy, uuid_);
  } else if (restart) {
    // Only a guest that is here, off, is started; one that is gone (this host's libvirt lost
    // it) is the usual steps' to make again once the move is over.
    auto here = co_await ctx_.virt(&VirtBackend::state, uuid_);
    if (!here) done = here.error();
    else if (*here == DomainState::stopped) done = co_await ctx_.virt(&VirtBackend::start, uuid_);
  }
  if (!done) co_return done.error().doing(left ? "removing its copy after its move" : "starting it again after its move");
  // The guest's domain key here goes with the move: once the move is over, what this host
  // publishes says where the guest is.
  std::vector<EtcdOp> domain_key;
  if (moved && source && !in_place) domain_key.push_back(steps_.presence.domain_erase(uuid_));
  auto erased = co_await steps_.mover.erase(move, revision, domain_key);
  if (!erased) co_return erased.error().doing("deleting its move record");
  if (!*erased) co_return Next::rest;
  if (!domain_key.empty()) steps_.presence.recorded(uuid_, domain_key.front());
  if (in_place) spdlog::info("instance {}: {}", uuid_, moved ? "resized" : "not resized");
  else spdlog::info("instance {}: {} host {}", uuid_, moved ? "moved from" : "did not move from", move.source);
  metrics::count("toyvm_moves_total", {{"result", moved ? "moved" : "reverted"}});
  known_.move.reset();
  known_.recheck_work = true;
  co_return Next::again;
}

}  // namespace toyvm::compute
