// toyvm schedule, once its claims are made: the hand-over to the chosen hosts in etcd (its
// keys created only where none exist, while this schedule's hold stands), taking a batch
// back when it cannot all go, and waiting for the instances to settle.

#include "services/scheduler.hpp"

#include "model/requests.hpp"
#include "model/txn_limits.hpp"
#include "services/common.hpp"
#include "services/schedule_plan.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>

namespace toyvm {

awaitable<Scheduler::HandOver> Scheduler::hand_over(const std::vector<WorkSpec>& specs,
                                                    const std::vector<InstanceRecord>& records) {
  HandOver out;
  std::vector<TxnCost> costs;
  for (size_t i = 0; i < specs.size(); ++i) costs.push_back(hand_over_cost(keys_, specs[i], records[i]));
  // For a member's request, the last transaction also writes the service's reply.
  std::string reply;
  if (on_behalf_) {
    ProjectReply answer;
    for (size_t i = 0; i < specs.size(); ++i) {
      answer.lines.push_back(fmt::format("NOTIFIED TARGET, {}, OF INSTANCE {}", records[i].host, records[i].uuid));
      answer.instances.push_back(specs[i].uuid);
    }
    reply = encode(answer);
    costs.back().compares += on_behalf_->require.size();
    costs.back().ops += 1;
    costs.back().bytes += on_behalf_->reply_key.size() + reply.size();
  }
  // This schedule's hold goes with its last claims.
  if (held_) {
    costs.back().ops += 1;
    costs.back().bytes += hold_key().size();
  }
  auto ends = split_by_limits(costs);
  if (!ends) {  // checked before claiming; a resource amount cannot make up the difference
    out.error = Error(errc::invalid_argument, "the instances' data is more than etcd takes in one request");
    co_return out;
  }
  const auto deadline = std::chrono::steady_clock::now() + 3 * config_.etcd.timeout;
  for (const size_t end : *ends) {
    const size_t first = out.handed;
    std::vector<Placed> placed;
    std::vector<EtcdCompare> absent;
    std::vector<EtcdOp> done;  // the hold on what is handed over
    for (size_t i = first; i < end; ++i) {
      placed.push_back(Placed{specs[i], records[i]});
      done.push_back(EtcdOp::erase(keys_.claim(specs[i].uuid)));
      absent.push_back(EtcdCompare::absent(keys_.work(records[i].host, specs[i].uuid)));
      absent.push_back(EtcdCompare::absent(keys_.instance(specs[i].uuid)));
      absent.push_back(EtcdCompare::present(keys_.claim(specs[i].uuid)));  // our hold stands
      // A host disabled since the look (a drain) takes nothing new: the drain counts on it.
      absent.push_back(EtcdCompare::absent(keys_.disabled(records[i].host)));
      if (!specs[i].group.empty()) absent.push_back(EtcdCompare::absent(keys_.group_member(specs[i].group, specs[i].uuid)));
    }
    if (auto standing = project_guard(keys_, project_)) absent.push_back(std::move(*standing));
    if (on_behalf_) {
      absent.insert(absent.end(), on_behalf_->require.begin(), on_behalf_->require.end());
      if (end == specs.size()) done.push_back(EtcdOp::put(on_behalf_->reply_key, reply, on_behalf_->reply_lease));
    }
    if (held_ && end == specs.size()) done.push_back(EtcdOp::erase(hold_key()));
    HandOverResult txn = co_await placer_.hand_over(std::move(placed), std::move(absent), std::move(done), deadline);
    switch (txn.outcome) {
      case HandOverResult::Outcome::committed:
        out.revision = txn.revision;
        out.handed = end;
        break;
      case HandOverResult::Outcome::refused: {  // keys exist that are not ours, a host was disabled, or our hold lapsed
        for (size_t i = first; i < end && out.disabled_host.empty(); ++i) {
          auto disabled = co_await etcd_->range(keys_.disabled(records[i].host));
          if (disabled && !disabled->kvs.empty()) out.disabled_host = records[i].host;
        }
        if (!out.disabled_host.empty()) {
          out.error = Error(errc::changed, fmt::format("host {} was disabled before the instance(s) reached it",
                                                       out.disabled_host));
          co_return out;
        }
        if (project_.revision != 0) {
          auto project = co_await etcd_->range(keys_.project(project_.name));
          if (project && (project->kvs.empty() || project->kvs.front().mod_revision != project_.revision)) {
            out.error = Error(errc::changed, fmt::format("project '{}' is being deleted", project_.name));
            co_return out;
          }
        }
        if (on_behalf_) {
          std::vector<EtcdCompare> standing = on_behalf_->require;
          std::vector<EtcdOp> nothing;
          auto still = co_await etcd_->txn(std::move(standing), std::move(nothing));
          if (still && !still->succeeded) {
            out.error = Error(errc::changed, "the request was withdrawn or answered, or this service no longer leads");
            co_return out;
          }
        }
        auto hold = co_await etcd_->range(keys_.claim(specs[first].uuid));
        out.hold_lapsed = hold && hold->kvs.empty();
        out.error = out.hold_lapsed ? Error(errc::timeout, fmt::format("this schedule's hold on its claims lapsed "
                                                                       "(etcd out of reach for more than {} s)",
                                                                       claim_hold_ttl_s))
                                    : Error(errc::already_exists, "an instance key already exists");
        co_return out;
      }
      case HandOverResult::Outcome::unknown:
        out.in_doubt = end - first;
        out.error = txn.error;
        co_return out;
    }
  }
  co_return out;
}

awaitable<Outcome> Scheduler::give_up_hand_over(HandOver handed, std::vector<std::string> uuids, std::vector<WorkSpec> specs,
                                            std::vector<InstanceRecord> records) {
  // Taken back in groups within etcd's limits, each only if no agent has touched it: the
  // first `undone` are out of etcd again, the rest of what was handed over is kept.
  size_t undone = 0;
  std::vector<TxnCost> costs;  // two compares and an erase of each of its keys
  for (size_t i = 0; i < handed.handed; ++i) {
    TxnCost cost{2, 0, 0};
    for (auto& [key, range_end] : keys_.instance_keys(records[i].host, specs[i].uuid, specs[i].group, specs[i].project)) {
      cost.ops += 1;
      cost.bytes += 2 * key.size() + range_end.size();
    }
    costs.push_back(cost);
  }
  for (const size_t end : split_by_limits(costs).value_or(std::vector<size_t>{})) {
    std::vector<EtcdCompare> untouched;
    std::vector<EtcdOp> remove;
    for (size_t i = undone; i < end; ++i) {
      for (std::string key : {keys_.work(records[i].host, specs[i].uuid), keys_.instance(specs[i].uuid)})
        untouched.push_back(EtcdCompare{key, EtcdCompare::Target::version, EtcdCompare::Result::equal, 1, {}});
      for (auto& [key, range_end] : keys_.instance_keys(records[i].host, specs[i].uuid, specs[i].group, specs[i].project))
        remove.push_back(EtcdOp::erase(key, range_end));
    }
    auto taken_back = co_await etcd_->txn(std::move(untouched), std::move(remove));
    if (!taken_back || !taken_back->succeeded) break;
    undone = end;
  }
  std::vector<std::string> release(uuids.begin(), uuids.begin() + long(undone));
  release.insert(release.end(), uuids.begin() + long(handed.handed + handed.in_doubt), uuids.end());
  co_await release_all(release);
  const size_t kept = handed.handed - undone;
  for (size_t i = undone; i < handed.handed; ++i)
    say_.line(fmt::format("NOTIFIED TARGET, {}, OF INSTANCE {}", records[i].host, records[i].uuid));
  std::string detail = fmt::format("cannot hand the instance(s) over through etcd at {}: {}", etcd_->endpoints_text(),
                                   handed.error.message());
  if (kept > 0) detail += fmt::format("; {} were handed over already and are kept", kept);
  if (handed.in_doubt > 0)
    detail += fmt::format("; {} may have been handed over, and keep their claims until `toyvm audit --fix`",
                          handed.in_doubt);
  co_return Error(handed.error.code, std::move(detail));
}

awaitable<result<void>> Scheduler::wait_until_settled(const std::string& uuid, int64_t since_revision) {
  std::optional<InstanceState> last;
  std::string last_ip;
  result<void> settled_as;
  auto settled = [&](const WatchEvent& event) {
    if (event.type == WatchEvent::Type::erase) {
      settled_as = Error(errc::not_reached, fmt::format("instance {} was deleted", uuid));
      return true;
    }
    auto record = decode_instance(event.kv.value);
    // ERROR counts once its allocation is given back: then it holds nothing.
    if (!record || (record->state == InstanceState::error && record->releasing)) return false;
    if (record->state == InstanceState::active && record->ip.empty() && record->no_address) {
      if (last != InstanceState::active) say_.line(fmt::format("INSTANCE {} ACTIVE", uuid));
      settled_as = Error(errc::no_address, fmt::format("instance {} is ACTIVE but its guest got no address within "
                                                       "its host's address_timeout",
                                                       uuid));
      return true;
    }
    if (record->state == last && record->ip == last_ip) return false;
    last = record->state;
    last_ip = record->ip;
    if (record->state == InstanceState::error) {
      say_.line(fmt::format("INSTANCE {} ERROR", uuid));
      settled_as = Error(errc::launch_failure,
                         fmt::format("instance {} failed: {}: {}", uuid, record->error_code, record->error_message));
      return true;
    }
    say_.line(fmt::format("INSTANCE {} {}{}{}", uuid, to_string(record->state), record->ip.empty() ? "" : " ",
                          record->ip));
    // A guest with a NIC is settled once its address is known too.
    return record->state == InstanceState::active && (record->mac.empty() || !record->ip.empty());
  };
  // A member reads its project's view of the record; the cloud's admin, the record.
  std::string key = member_ ? keys_.project_instance(member_->project, uuid) : keys_.instance(uuid);
  auto followed = co_await follow_key(*etcd_, std::move(key), since_revision, options_.wait_timeout, settled);
  if (!followed) co_return etcd_error(*etcd_, followed.error());
  if (*followed) co_return settled_as;
  if (last == InstanceState::active)
    co_return Error(errc::no_address, fmt::format("instance {} is ACTIVE but has no address after {} s", uuid,
                                                  in_seconds(options_.wait_timeout)));
  co_return Error(errc::not_reached,
                  fmt::format("instance {} did not settle within {} s", uuid, in_seconds(options_.wait_timeout)));
}

}  // namespace toyvm
