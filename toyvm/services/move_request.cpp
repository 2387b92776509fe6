#include "services/move_request.hpp"

#include "model/query.hpp"
#include "model/uuid.hpp"
#include "services/quota.hpp"

#include <fmt/format.h>

namespace toyvm {

awaitable<result<std::string>> resolve_host(Placement& placement, std::string host) {
  auto named = co_await placement.provider_named(host);
  if (!named) co_return named.error();
  if (*named) co_return **named;
  if (is_uuid(host)) {
    auto traits = co_await placement.traits(host);
    if (traits) co_return host;
    if (traits.error() != errc::not_found) co_return traits.error();
  }
  co_return Error(errc::not_found, fmt::format("no host {} in Placement", host));
}

awaitable<result<MoveAsked>> MoveRequests::ask(std::string uuid, std::string destination, bool cold,
                                               std::string resize_to) {
  const bool resize = !resize_to.empty();
  cold = cold || resize;
  ProjectUsage grows;                     // a resize: what it grows by
  std::optional<ProjectStanding> project;  // whose quota that counts against
  auto recorded = co_await etcd_.range(keys_.instance(uuid));
  if (!recorded) co_return recorded.error();
  if (recorded->kvs.empty()) co_return Error(errc::not_found, fmt::format("no instance {}", uuid));
  auto record = decode_instance(recorded->kvs.front().value);
  if (!record) co_return record.error().doing(fmt::format("instance {}", uuid));
  // A stopped one moves as it is, off.
  if (record->state == InstanceState::stopped) cold = true;
  else if (record->state != InstanceState::active)
    co_return Error(errc::invalid_argument, fmt::format("instance {} is {}: only a running or stopped instance moves",
                                                        uuid, to_string(record->state)));
  const std::string source = record->host;
  const std::string work_key = keys_.work(source, uuid);
  auto listed = co_await etcd_.range(work_key);
  if (!listed) co_return listed.error();
  if (listed->kvs.empty()) co_return Error(errc::changed, fmt::format("instance {} has no work on its host", uuid));
  const KeyValue work_kv = listed->kvs.front();
  auto work = decode_work(work_kv.value);
  if (!work) co_return work.error().doing(fmt::format("instance {}'s work", uuid));
  if (work->power == PowerState::deleted)
    co_return Error(errc::invalid_argument, fmt::format("instance {} is being destroyed", uuid));
  if (work->power != PowerState::running && !cold)
    co_return Error(errc::invalid_argument, fmt::format("instance {} is being stopped: it moves cold (--cold)", uuid));
  // Its agent moves it: a host whose agent is down is evacuated instead.
  auto alive = co_await etcd_.range(keys_.host(source));
  if (!alive) co_return alive.error();
  if (alive->kvs.empty())
    co_return Error(errc::invalid_argument, fmt::format("the agent of instance {}'s host {} is not running "
                                                        "(`toyvm evacuate` moves guests off a dead host)",
                                                        uuid, source));
  if (destination == source && !resize)
    co_return Error(errc::invalid_argument, fmt::format("instance {} is on host {} already", uuid, destination));
  if (resize) {
    auto after = resized(*work, resize_to);
    if (!after) co_return after.error().doing(fmt::format("resizing instance {}", uuid));
    // What it grows by counts against its project's quota (Placement counts its new size once,
    // never the old size its migration consumer keeps meanwhile); shrinking is always allowed.
    for (const auto& [rc, amount] : after->resources) {
      auto before = work->resources.find(rc);
      const int64_t more = amount - (before == work->resources.end() ? 0 : before->second);
      if (more > 0) grows.amounts[rc] = more;
    }
    if (!grows.amounts.empty()) {
      auto read = co_await read_project(etcd_, keys_, work->project);
      if (!read) co_return read.error();
      project = std::move(*read);
      auto fits = co_await check_quota(placer_.placement(), placer_.config().placement, *project, grows, false);
      if (!fits) co_return fits.error();
    }
    work = std::move(*after);
  }
  if (!destination.empty()) {
    auto host = co_await etcd_.range(keys_.host(destination));
    if (!host) co_return host.error();
    auto live = host->kvs.empty() ? result<HostRecord>(Error(errc::not_found)) : decode_host(host->kvs.front().value);
    if (!live || live->status != "READY")
      co_return Error(errc::invalid_argument, fmt::format("host {} is not taking guests (no running agent, "
                                                          "disabled or full)", destination));
  }
  // The record first, so that whatever becomes of this command its source's agent finds the
  // move (and undoes it once overdue); then the placer's one move engine chooses its host,
  // moves the books and claims it in the record, guarded by the work and the record as read.
  MoveRecord move;
  move.instance = uuid;
  move.migration = new_uuid();
  move.source = source;
  move.kind = resize ? MoveKind::resize : cold ? MoveKind::cold : MoveKind::live;
  move.query = std::move(resize_to);
  move.started_at = unix_millis();
  const std::string move_key = keys_.move(uuid);
  std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(work_key, work_kv.mod_revision),
                                   EtcdCompare::absent(move_key)};
  std::vector<EtcdOp> put{EtcdOp::put(move_key, encode(move))};
  auto txn = co_await etcd_.txn(std::move(as_read), std::move(put));
  if (!txn) co_return txn.error();
  if (!txn->succeeded)
    co_return Error(errc::changed, fmt::format("instance {} changed, or is moving already", uuid));
  Relocation relocation;
  relocation.work = std::move(*work);
  relocation.from = source;
  relocation.to = destination;
  relocation.may_stay = resize;  // its own host, if it has room for both sizes
  relocation.work_revision = work_kv.mod_revision;
  relocation.also_require = {EtcdCompare::mod_revision_is(move_key, txn->revision)};
  relocation.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto relocated = co_await placer_.claim_move(std::move(relocation), move);
  if (relocated && relocated->outcome == Relocated::Outcome::moved) {
    move.destination = relocated->host;
    move.state = MoveState::claimed;
    // Again with the new size counted: a request of the project that raced it may have taken
    // the room; the resize then gives way, undone by its source's agent as an abort is.
    if (project) {
      auto fits = co_await check_quota(placer_.placement(), placer_.config().placement, *project, grows, true);
      if (!fits) {
        co_await abort(uuid);
        co_return fits.error();
      }
    }
    co_return MoveAsked{std::move(move), relocated->revision};
  }
  if (relocated && relocated->outcome == Relocated::Outcome::stranded)
    co_return Error(errc::changed, fmt::format("instance {}: its move could not be told claimed nor undone; its host's "
                                               "agent undoes it within move_prepare_timeout", uuid));
  // Placement or etcd did not answer: the books may have moved all the same, and are swapped
  // back before the record goes (or, when that cannot be done either, left with the record
  // to the source's agent).
  if (!relocated) {
    auto back = co_await placer_.revert_move(uuid, move.migration);
    if (!back) co_return relocated.error();
  }
  // Nothing of the move is left in the books: its record goes too, unless its source's agent
  // has it already.
  std::vector<EtcdCompare> as_written{EtcdCompare::mod_revision_is(move_key, txn->revision)};
  std::vector<EtcdOp> gone{EtcdOp::erase(move_key)};
  auto erased = co_await etcd_.txn(std::move(as_written), std::move(gone));
  if (!relocated) co_return relocated.error();
  if (!erased) co_return erased.error();
  if (relocated->outcome == Relocated::Outcome::no_room) {
    if (destination.empty())
      co_return Error(errc::no_allocations_left, fmt::format("no other host has room for instance {}", uuid));
    co_return Error(errc::no_allocations_left, fmt::format("host {} has no room for instance {}", destination, uuid));
  }
  co_return Error(errc::changed, fmt::format("instance {} changed while its move was asked", uuid));
}

awaitable<result<MoveAsked>> MoveRequests::abort(std::string uuid) {
  const std::string key = keys_.move(uuid);
  auto read = co_await etcd_.range(key);
  if (!read) co_return read.error();
  if (read->kvs.empty()) co_return Error(errc::not_found, fmt::format("instance {} is not moving", uuid));
  const KeyValue kv = read->kvs.front();
  auto move = decode_move(kv.value);
  if (!move) co_return move.error().doing(fmt::format("instance {}'s move", uuid));
  // Past these the guest is on its destination (or nowhere): the move can only be finished.
  if (move->state == MoveState::left_source || move->state == MoveState::copied || move->state == MoveState::switched)
    co_return Error(errc::changed, fmt::format("instance {} has left host {} already (its move is {}): too late "
                                               "to abort", uuid, move->source, to_string(move->state)));
  MoveAsked asked{*move, kv.mod_revision};
  if (move->abort || move->state == MoveState::reverting) co_return asked;  // undone already
  asked.move.abort = true;
  std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(key, kv.mod_revision)};
  std::vector<EtcdOp> put{EtcdOp::put(key, encode(asked.move))};
  auto txn = co_await etcd_.txn(std::move(as_read), std::move(put));
  if (!txn) co_return txn.error();
  if (!txn->succeeded) co_return Error(errc::changed, fmt::format("instance {}'s move changed meanwhile; ask again", uuid));
  asked.revision = txn->revision;
  co_return asked;
}

awaitable<result<MoveEnded>> MoveRequests::follow(MoveAsked asked, Duration timeout) {
  std::string error;
  auto gone = [&](const WatchEvent& event) {
    if (event.type == WatchEvent::Type::erase) return true;
    if (auto move = decode_move(event.kv.value); move && move->state == MoveState::reverting) error = move->error;
    return false;
  };
  const std::string uuid = asked.move.instance;
  auto followed = co_await follow_key(etcd_, keys_.move(uuid), asked.revision + 1,
                                      std::chrono::duration_cast<std::chrono::milliseconds>(timeout), gone);
  if (!followed) co_return followed.error();
  if (!*followed)
    co_return Error(errc::timeout, fmt::format("instance {} is still moving after {} s; its hosts' agents go on with it",
                                               uuid, in_seconds(timeout)));
  auto recorded = co_await etcd_.range(keys_.instance(uuid));
  if (!recorded) co_return recorded.error();
  MoveEnded ended;
  std::optional<InstanceRecord> record;
  if (!recorded->kvs.empty())
    if (auto decoded = decode_instance(recorded->kvs.front().value)) record = std::move(*decoded);
  if (record && record->state == InstanceState::building) {
    // Moved powered off, to run: it has moved once it runs there (or has failed to).
    auto started = [&](const WatchEvent& event) {
      if (event.type == WatchEvent::Type::erase) return true;
      auto now = decode_instance(event.kv.value);
      if (now) record = *now;
      return now && now->state != InstanceState::building;
    };
    auto ran = co_await follow_key(etcd_, keys_.instance(uuid), recorded->revision + 1,
                                   std::chrono::duration_cast<std::chrono::milliseconds>(timeout), started);
    if (!ran) co_return ran.error();
    if (!*ran)
      co_return Error(errc::timeout, fmt::format("instance {} moved to host {} but is not running there after {} s",
                                                 uuid, record->host, in_seconds(timeout)));
  }
  if (record) ended.host = record->host;
  // A resize in place ends on its host either way: undone, it went through reverting.
  ended.moved = ended.host == asked.move.destination && (asked.move.source != asked.move.destination || error.empty());
  ended.error = ended.moved ? "" : error.empty() ? "the move was undone" : error;
  if (ended.moved && record && record->state == InstanceState::error) {
    ended.moved = false;
    ended.error = fmt::format("it moved to host {} and failed there: {}", record->host, record->error_message);
  }
  co_return ended;
}

}  // namespace toyvm
