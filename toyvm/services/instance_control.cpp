// toyvm destroy, start and stop: each asks the instance's agent through its work key in
// etcd, only over the version read, and waits for the record to say it is done. destroy
// --force does the agent's part itself for a host that is gone for good.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "core/failpoint.hpp"
#include "model/keys.hpp"
#include "model/moves.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"
#include "services/common.hpp"
#include "services/member.hpp"
#include "services/instance_lookup.hpp"
#include "services/services.hpp"

#include <optional>

namespace toyvm {
namespace {

// Without the host, and only as it was read: the keys go in one transaction guarded by the
// revisions of the record and the work read here, so an instance that an evacuation or a
// move took elsewhere meanwhile is left alone; then its allocation, guarded by the consumer
// generation read before (one that moved since is left for `toyvm audit` to judge).
awaitable<Outcome> force_destroy(asio::io_context& io, EtcdClient& etcd, const KeyLayout& keys, const Config& config,
                                 const InstanceRecord& record, int64_t record_revision, Say& say) {
  PlacementClient placement(io.get_executor(), config.placement);
  auto held = co_await placement.consumer_allocations(record.uuid);
  if (!held) co_return held.error().doing(fmt::format("reading the allocation of {}", record.uuid));
  if (!held->allocations.empty() && !held->allocations.count(record.host))
    co_return Error(errc::changed, fmt::format("instance {} holds its resources on another host than {} (a move in flight?); "
                                         "nothing removed",
                                         record.uuid, record.host));
  const std::string work_key = keys.work(record.host, record.uuid);
  auto work = co_await etcd.range(work_key);
  if (!work) co_return etcd_error(etcd, work.error());
  std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(keys.instance(record.uuid), record_revision)};
  if (work->kvs.empty()) {
    as_read.push_back(EtcdCompare::absent(work_key));
  } else {
    as_read.push_back(EtcdCompare::mod_revision_is(work_key, work->kvs.front().mod_revision));
  }
  // A move in flight goes with it: its migration consumer's share is released too.
  auto moving = co_await etcd.range(keys.move(record.uuid));
  if (!moving) co_return etcd_error(etcd, moving.error());
  std::string migration;
  if (moving->kvs.empty()) {
    as_read.push_back(EtcdCompare::absent(keys.move(record.uuid)));
  } else {
    as_read.push_back(EtcdCompare::mod_revision_is(keys.move(record.uuid), moving->kvs.front().mod_revision));
    if (auto move = decode_move(moving->kvs.front().value)) migration = move->migration;
  }
  // Its group, as its membership says: its work, which names it too, may not be readable.
  auto members = co_await etcd.range_prefix(keys.groups_root());
  if (!members) co_return etcd_error(etcd, members.error());
  std::string group;
  for (const KeyValue& kv : members->kvs)
    if (auto member = keys.parse_group_member(kv.key); member && member->instance == record.uuid) group = member->group;
  std::vector<EtcdOp> erase;
  for (auto& [key, range_end] : keys.instance_keys(record.host, record.uuid, group, record.project))
    erase.push_back(EtcdOp::erase(key, range_end));
  co_await failpoint::pass("destroy.force");  // read, not yet written
  auto txn = co_await etcd.txn(std::move(as_read), std::move(erase));
  if (!txn) co_return etcd_error(etcd, txn.error());
  if (!txn->succeeded)
    co_return Error(errc::changed, fmt::format("instance {} changed while it was being destroyed (moved, "
                                                         "evacuated, or its host came back); nothing removed",
                                                         record.uuid));
  if (held->generation && !held->allocations.empty()) {
    auto released = co_await placement.replace(record.uuid, {}, *held->generation, held->owner);
    if (!released)
      co_return Error(released.error().code,
                      fmt::format("instance {} is removed, but its allocation was not released ({}); "
                                  "`toyvm audit --fix` releases it",
                                  record.uuid, released.error().message()));
  }
  if (!migration.empty()) {
    if (auto released = co_await placement.release(migration); !released)
      co_return Error(released.error().code,
                      fmt::format("instance {} is removed, but its move's allocation was not released "
                                  "({}); `toyvm audit --fix` releases it",
                                  record.uuid, released.error().message()));
  }
  say.line(fmt::format("DESTROYED INSTANCE {}", record.uuid));
  co_return ExitCode::ok;
}

// What a wait makes of the instance's record as it changes (nothing while the record is gone):
// done, not yet (nothing), or an error that ends the wait.
using Reached = std::optional<result<void>>;

// Follows the instance key from `revision` until `reached` says so or the timeout passes.
template <class Reach>
awaitable<result<void>> wait_for_record(EtcdClient& etcd, const KeyLayout& keys, const std::string& uuid,
                                        int64_t revision, Duration timeout, const char* waiting_for, Reach reach) {
  Reached reached;
  auto follow = [&](const WatchEvent& event) {
    std::optional<InstanceRecord> record;
    if (event.type == WatchEvent::Type::put) {
      auto decoded = decode_instance(event.kv.value);
      if (!decoded) return false;  // a corrupt record is `toyvm audit`'s business
      record = std::move(*decoded);
    }
    reached = reach(record);
    return reached.has_value();
  };
  auto followed = co_await follow_key(etcd, keys.instance(uuid), revision + 1, timeout, follow);
  if (!followed) co_return etcd_error(etcd, followed.error());
  if (*followed) co_return *reached;
  co_return Error(errc::not_reached, fmt::format("instance {} is not {} after {} s; its host may be down", uuid,
                                                 waiting_for, in_seconds(timeout)));
}

// A member's stop, start or destroy: asked of the scheduler service (which acts on its
// project's instances only), then waited for on the project's view of the instance.
awaitable<Outcome> member_power(EtcdClient& etcd, const KeyLayout& keys, const ProjectMembership& member,
                                std::string uuid, PowerState power, bool wait, Duration timeout, Say& say) {
  if (member.role != ProjectRole::member)
    co_return Error(errc::permission_denied, fmt::format("a reader of project {} cannot change instances", member.project));
  ProjectRequest request;
  request.action = power == PowerState::deleted   ? RequestAction::destroy
                   : power == PowerState::stopped ? RequestAction::stop
                                                  : RequestAction::start;
  request.instance = uuid;
  request.asked_at = unix_millis();
  auto reply = co_await ask_service(etcd, keys, member.project, std::move(request), std::chrono::seconds(60));
  if (!reply) co_return with_endpoints(etcd, reply.error());
  Outcome asked = reply_outcome(*reply, say);
  if (!asked || *asked != ExitCode::ok) co_return asked;
  const char* done = power == PowerState::deleted ? "DESTROYED" : power == PowerState::stopped ? "STOPPED" : "STARTED";
  if (!wait) {
    say.line(fmt::format("{} INSTANCE {}", power == PowerState::deleted   ? "DESTROYING"
                                           : power == PowerState::stopped ? "STOPPING"
                                                                          : "STARTING",
                         uuid));
    co_return ExitCode::ok;
  }
  const InstanceState wanted = power == PowerState::stopped ? InstanceState::stopped : InstanceState::active;
  Error failed;
  auto reached = [&](const WatchEvent& event) {
    if (event.type == WatchEvent::Type::erase) {
      if (power != PowerState::deleted) failed = Error(errc::not_found, fmt::format("instance {} was destroyed", uuid));
      return true;
    }
    auto record = decode_instance(event.kv.value);
    if (!record || power == PowerState::deleted) return false;
    if (record->state == InstanceState::error) {
      failed = Error(errc::launch_failure, fmt::format("instance {}: {}: {}", uuid, record->error_code, record->error_message));
      return true;
    }
    return record->state == wanted;
  };
  const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  std::function<bool(const WatchEvent&)> seen = reached;  // made outside co_await (GCC 12)
  auto followed = co_await follow_key(etcd, keys.project_instance(member.project, uuid), 0, wait_ms, std::move(seen));
  if (!followed) co_return etcd_error(etcd, followed.error());
  if (!*followed) co_return Error(errc::not_reached, fmt::format("instance {} is not {} after {:g} s", uuid, done,
                                                                 in_seconds(timeout)));
  if (failed.code) co_return failed;
  say.line(fmt::format("{} INSTANCE {}", done, uuid));
  co_return ExitCode::ok;
}

using Membership = std::optional<ProjectMembership>;

awaitable<Outcome> destroy_one(asio::io_context& io, EtcdClient& etcd, const KeyLayout& keys, const Config& config,
                               const Membership& membership, const DestroyOptions& options, std::string uuid,
                               Say& say) {
  if (membership)
    co_return co_await member_power(etcd, keys, *membership, uuid, PowerState::deleted, options.wait,
                                    options.wait_timeout, say);
  auto target = co_await find_instance(etcd, keys, uuid, power_patience);
  if (!target) co_return target.error();
  if (options.force)
    co_return co_await force_destroy(io, etcd, keys, config, target->record, target->mod_revision, say);
  co_await failpoint::pass("destroy.asking");  // the record read, the request not yet written
  if (auto asked = co_await request_power(etcd, keys, target->record, PowerState::deleted); !asked)
    co_return asked.error();
  if (!options.wait) {
    say.line(fmt::format("DESTROYING INSTANCE {}", uuid));
    co_return ExitCode::ok;
  }
  // Done when the agent has deleted the instance key.
  auto gone = [](const std::optional<InstanceRecord>& record) { return record ? Reached() : Reached(result<void>{}); };
  auto waited = co_await wait_for_record(etcd, keys, uuid, target->revision, options.wait_timeout, "gone", gone);
  if (!waited) co_return waited.error();
  say.line(fmt::format("DESTROYED INSTANCE {}", uuid));
  co_return ExitCode::ok;
}

// Destroys options.uuids[next...] one after another, beside the other workers.
awaitable<void> destroy_worker(asio::io_context& io, EtcdClient& etcd, const KeyLayout& keys, const Config& config,
                               const Membership& membership, const DestroyOptions& options, size_t& next,
                               std::vector<Outcome>& outcomes, Say& say) {
  while (next < options.uuids.size()) {
    const size_t i = next++;
    outcomes[i] = co_await destroy_one(io, etcd, keys, config, membership, options, options.uuids[i], say);
  }
}

// Instances destroyed at once by one `toyvm destroy`.
constexpr size_t destroys_at_once = 32;

}  // namespace

Outcome run_destroy(const Config& config, const DestroyOptions& options, Say& say) {
  if (options.uuids.empty()) return Error(errc::invalid_argument, "no instance uuid given");
  for (const std::string& uuid : options.uuids)
    if (!is_uuid(uuid)) return Error(errc::invalid_argument, fmt::format("'{}' is not an instance uuid", uuid));
  return run_on_loop([&](asio::io_context& io) -> awaitable<Outcome> {
    auto etcd = EtcdClient::create(config.etcd);
    KeyLayout keys(config.etcd.prefix);
    auto membership = co_await caller_membership(*etcd, keys, config.etcd, "");
    if (!membership) co_return with_endpoints(*etcd, membership.error());
    if (*membership && options.force) co_return Error(errc::permission_denied, "destroy --force is the cloud admin's");
    std::vector<Outcome> outcomes(options.uuids.size(), ExitCode::ok);
    size_t next = 0;
    std::vector<awaitable<void>> workers;
    for (size_t w = 0; w < std::min(destroys_at_once, options.uuids.size()); ++w)
      workers.push_back(destroy_worker(io, *etcd, keys, config, *membership, options, next, outcomes, say));
    co_await run_together(std::move(workers));
    // Each instance's failure told, named when there are several; the command ends with the
    // first's, in the order asked.
    std::optional<Outcome> first;
    for (size_t i = 0; i < outcomes.size(); ++i) {
      Outcome outcome = outcomes[i];
      if (outcome && *outcome == ExitCode::ok) continue;
      if (!outcome && outcomes.size() > 1) outcome = outcome.error().doing(options.uuids[i]);
      if (!first) {
        first = outcome;
      } else {
        say.note(outcome ? fmt::format("{}: exit {}", options.uuids[i], int(*outcome)) : outcome.error().message());
      }
    }
    co_return first.value_or(ExitCode::ok);
  });
}

Outcome run_power(const Config& config, const PowerOptions& options, Say& say) {
  if (!is_uuid(options.uuid))
    return Error(errc::invalid_argument, fmt::format("'{}' is not an instance uuid", options.uuid));
  const bool on = options.power == PowerState::running;
  const InstanceState wanted = on ? InstanceState::active : InstanceState::stopped;
  return run_on_loop([&](asio::io_context&) -> awaitable<Outcome> {
    auto etcd = EtcdClient::create(config.etcd);
    KeyLayout keys(config.etcd.prefix);
    auto membership = co_await caller_membership(*etcd, keys, config.etcd, "");
    if (!membership) co_return with_endpoints(*etcd, membership.error());
    if (*membership)
      co_return co_await member_power(*etcd, keys, **membership, options.uuid, options.power, options.wait,
                                      options.wait_timeout, say);
    auto target = co_await find_instance(*etcd, keys, options.uuid, power_patience);
    if (!target) co_return target.error();
    if (target->record.state == InstanceState::error)
      co_return Error(errc::changed,
                      fmt::format("instance {} is in ERROR ({}); destroy it", options.uuid, target->record.error_code));
    if (auto asked = co_await request_power(*etcd, keys, target->record, options.power); !asked)
      co_return asked.error();
    const char* verb = on ? "STARTED" : "STOPPED";
    if (options.wait && target->record.state != wanted) {
      auto reach = [&](const std::optional<InstanceRecord>& record) -> Reached {
        if (!record) return Error(errc::not_found, fmt::format("instance {} was destroyed", options.uuid));
        if (record->state == InstanceState::error)
          return Error(errc::launch_failure, fmt::format("instance {}: {}: {}", options.uuid, record->error_code,
                                                         record->error_message));
        if (record->state == wanted) return result<void>{};
        return std::nullopt;
      };
      auto waited = co_await wait_for_record(*etcd, keys, options.uuid, target->revision, options.wait_timeout,
                                             on ? "ACTIVE" : "STOPPED", reach);
      if (!waited) co_return waited.error();
    } else if (!options.wait) {
      verb = on ? "STARTING" : "STOPPING";
    }
    say.line(fmt::format("{} INSTANCE {}", verb, options.uuid));
    co_return ExitCode::ok;
  });
}

}  // namespace toyvm
