#include "services/compute/mover.hpp"

#include "model/groups.hpp"

#include <fmt/format.h>

namespace toyvm::compute {

using namespace std::chrono_literals;

awaitable<result<std::optional<int64_t>>> Mover::guarded(const std::string& instance, int64_t revision,
                                                         std::vector<EtcdOp> ops) {
  std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(ctx_.keys.move(instance), revision)};
  auto txn = co_await ctx_.etcd->txn(std::move(as_read), std::move(ops));
  if (!txn) co_return txn.error();
  if (!txn->succeeded) co_return std::nullopt;
  co_return txn->revision;
}

awaitable<result<std::optional<int64_t>>> Mover::write(MoveRecord next, int64_t revision) {
  std::vector<EtcdOp> put{EtcdOp::put(ctx_.keys.move(next.instance), encode(next))};
  co_return co_await guarded(next.instance, revision, std::move(put));
}

awaitable<result<bool>> Mover::erase(const MoveRecord& move, int64_t revision, std::vector<EtcdOp> also) {
  also.push_back(EtcdOp::erase(ctx_.keys.move(move.instance)));
  auto erased = co_await guarded(move.instance, revision, std::move(also));
  if (!erased) co_return erased.error();
  co_return erased->has_value();
}

namespace {
// The work as the move leaves it: a resize's new size, or as it is.
result<WorkSpec> moved_work(const MoveRecord& move, WorkSpec work) {
  if (move.kind != MoveKind::resize) return work;
  return resized(std::move(work), move.query);
}
}  // namespace

awaitable<result<WorkSpec>> Mover::moving_work(const MoveRecord& move) {
  auto listed = co_await ctx_.etcd->range(ctx_.keys.work(move.source, move.instance));
  if (!listed) co_return listed.error();
  if (listed->kvs.empty()) co_return Error(errc::changed, "its work left its source");
  auto work = decode_work(listed->kvs.front().value);
  if (!work) co_return work.error();
  co_return moved_work(move, std::move(*work));
}

awaitable<result<DomainSpec>> Mover::incoming_spec(const MoveRecord& move, std::optional<WorkSpec> work) {
  if (!work) {
    auto read = co_await moving_work(move);
    if (!read) co_return read.error();
    work = std::move(*read);
  }
  // Its address goes with it: the guest asks DHCP nothing on arrival, and its filter must let
  // it send from that address at once.
  std::string ip;
  auto recorded = co_await ctx_.etcd->range(ctx_.keys.instance(move.instance));
  if (!recorded) co_return recorded.error();
  if (!recorded->kvs.empty())
    if (auto record = decode_instance(recorded->kvs.front().value)) ip = record->ip;
  co_return co_await builder_.incoming_domain(std::move(*work), ip);
}

awaitable<result<MoveRecord>> Mover::prepare(MoveRecord move) {
  // A host being drained takes nothing new: what heads for it goes back (or elsewhere). A
  // disable after this read finds the guest here, and the drain moves it on.
  auto disabled = co_await builder_.host_disabled();
  if (!disabled) co_return disabled.error();
  if (*disabled) co_return Error(errc::no_valid_host, fmt::format("host {} was disabled by an operator", ctx_.host.name));
  auto work = co_await moving_work(move);
  if (!work) co_return work.error();
  // Hard group policies hold across moves as across builds: checked here, as a build does.
  if (!work->group.empty()) {
    auto allowed = co_await builder_.group_allows_here(*work);
    if (!allowed) co_return allowed.error();
    if (!*allowed)
      co_return Error(errc::no_valid_host,
                      fmt::format("server group {} ({}) does not allow it on host {}", work->group,
                                  work->group_policy ? to_string(*work->group_policy) : "no policy", ctx_.host.name));
  }
  std::optional<WorkSpec> known = std::move(*work);  // a named local: GCC 12 and temporaries in co_await
  auto spec = co_await incoming_spec(move, std::move(known));
  if (!spec) co_return spec.error();
  auto xml = co_await ctx_.virt(&VirtBackend::prepare_incoming, *spec);
  if (!xml) co_return xml.error();
  const ComputeConfig& c = ctx_.config.compute;
  const std::string& address = c.move_address.empty() ? ctx_.host.name : c.move_address;
  move.state = MoveState::ready;
  move.libvirt_uri = c.move_libvirt_uri.empty() ? "qemu+tcp://" + ctx_.host.name + "/system" : c.move_libvirt_uri;
  move.migration_uri = "tcp://" + address;
  move.domain_xml = std::move(*xml);
  if (move.kind != MoveKind::live) move.disk = overlay_path(ctx_.host.instance_dir, move.instance);
  co_return move;
}

awaitable<result<MigrationStats>> Mover::send(const MoveRecord& move, std::chrono::milliseconds completion_timeout) {
  MigrationTarget to{move.libvirt_uri, move.migration_uri, move.domain_xml, completion_timeout};
  co_return co_await ctx_.virt.sending(&VirtBackend::migrate, move.instance, to);
}

awaitable<result<void>> Mover::copy(const MoveRecord& move) {
  co_return co_await ctx_.virt.sending(&VirtBackend::send_disk, move.instance, move.libvirt_uri, move.disk);
}

awaitable<result<void>> Mover::receive(const MoveRecord& move) {
  auto spec = co_await incoming_spec(move);
  if (!spec) co_return spec.error();
  co_return co_await ctx_.virt(&VirtBackend::receive_disk, *spec, move.domain_xml);
}

awaitable<result<void>> Mover::resize_here(const MoveRecord& move) {
  auto spec = co_await incoming_spec(move);
  if (!spec) co_return spec.error();
  co_return co_await ctx_.virt(&VirtBackend::resize_in_place, *spec);
}

awaitable<result<std::optional<int64_t>>> Mover::switch_over(MoveRecord move, int64_t revision,
                                                             std::vector<EtcdOp> also) {
  const std::string source_work = ctx_.keys.work(move.source, move.instance);
  auto listed = co_await ctx_.etcd->range(source_work);
  if (!listed) co_return listed.error();
  if (listed->kvs.empty()) co_return std::nullopt;  // the move record changed too, or will
  const KeyValue& read = listed->kvs.front();
  auto decoded = decode_work(read.value);
  if (!decoded) co_return decoded.error();  // not switched on what cannot be read
  auto work = moved_work(move, std::move(*decoded));
  if (!work) co_return work.error();
  InstanceRecord record;
  auto recorded = co_await ctx_.etcd->range(ctx_.keys.instance(move.instance));
  if (!recorded) co_return recorded.error();
  if (!recorded->kvs.empty())
    if (auto decoded = decode_instance(recorded->kvs.front().value)) record = std::move(*decoded);
  record.uuid = work->uuid;
  record.name = work->name;
  record.project = work->project;
  record.host = move.destination;
  // A guest that moved live runs there already; one moved powered off, to run, is started
  // there after this write, and is ACTIVE only once it runs (its agent records it).
  if (work->power == PowerState::stopped) record.state = InstanceState::stopped;
  else if (work->power == PowerState::running)
    record.state = move.kind == MoveKind::live ? InstanceState::active : InstanceState::building;
  record.updated_at = unix_millis();
  move.state = MoveState::switched;
  move.domain_xml.clear();  // the destination has it; the record stays small
  const std::string move_key = ctx_.keys.move(move.instance);
  std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(source_work, read.mod_revision),
                                   EtcdCompare::mod_revision_is(move_key, revision)};
  if (move.destination != move.source) also.push_back(EtcdOp::erase(source_work));  // else rewritten in place
  also.push_back(EtcdOp::put(move_key, encode(move)));
  std::vector<Placed> placed{Placed{std::move(*work), std::move(record)}};
  // Read back by the move record, switched by this write: a resize in place rewrites a work key
  // that was there before, and could not tell this write from an earlier one.
  Placer::ReadBack ours{move_key, [migration = move.migration](const KeyValue& kv) -> std::optional<int64_t> {
                          auto now = decode_move(kv.value);
                          if (now && now->migration == migration && now->state == MoveState::switched)
                            return kv.mod_revision;
                          return std::nullopt;
                        }};
  auto handed = co_await placer_.hand_over(std::move(placed), std::move(as_read), std::move(also),
                                           std::chrono::steady_clock::now() + 10s, std::move(ours));
  switch (handed.outcome) {
    case HandOverResult::Outcome::committed: co_return handed.revision;
    case HandOverResult::Outcome::refused: co_return std::nullopt;
    case HandOverResult::Outcome::unknown: break;
  }
  co_return handed.error;
}

awaitable<result<void>> Mover::settle(const MoveRecord& move) {
  co_return co_await placer_.finish_move(move.migration);
}

awaitable<result<void>> Mover::unwind(const MoveRecord& move) {
  auto reverted = co_await placer_.revert_move(move.instance, move.migration);
  if (!reverted) co_return reverted.error();
  co_return result<void>{};
}

}  // namespace toyvm::compute
