#include "services/placer.hpp"

#include "core/backoff.hpp"
#include "model/placement_error.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace toyvm {

using namespace asio::experimental::awaitable_operators;

awaitable<result<PlacementView>> Placer::look(PlacementQuery query, std::string group, std::string moving,
                                              int limit, Duration timeout) {
  // Only toyvm's agents' providers; stopped agents mark theirs disabled (microversion 1.39
  // lets `required` repeat).
  query.params.emplace_back("required", config_.placement.provider_trait);
  query.params.emplace_back("required", "!" + std::string(disabled_trait));
  co_await placement_.preconnect();
  auto candidates =
      co_await placement_.allocation_candidates(query.to_query_string(limit > 0 ? limit : config_.placement.candidate_limit),
                                                timeout);
  PlacementView view;
  if (!candidates) {
    // A shard no host has joined yet: Placement has never heard of its trait, and there is no
    // room in it.
    if (is_shard_trait(unknown_trait(candidates.error()))) co_return view;
    co_return candidates.error();
  }
  view.candidates = std::move(*candidates);
  // Only the candidates' host records, not the cloud's: what a schedule reads from etcd does
  // not grow with the number of hosts. (In transactions of 100 reads: etcd takes 128.) A
  // group's members come first in the first one, read in the same instant as the hosts.
  const std::string members = group.empty() ? std::string() : keys_.group_prefix(group);
  std::vector<EtcdOp> reads;
  if (!members.empty()) reads.push_back(EtcdOp::get(members, prefix_range_end(members)));
  for (const auto& [provider, summary] : view.candidates.provider_summaries) reads.push_back(EtcdOp::get(keys_.host(provider)));
  for (size_t first = 0; first < reads.size(); first += 100) {
    std::vector<EtcdOp> chunk(reads.begin() + ptrdiff_t(first), reads.begin() + ptrdiff_t(std::min(reads.size(), first + 100)));
    std::vector<EtcdCompare> always;
    auto read = co_await txn_asking_again(etcd_, std::move(always), std::move(chunk), config_.etcd.timeout);
    if (!read) co_return read.error();
    auto hosts = read->ranges.begin();
    if (first == 0 && !members.empty()) {
      for (const KeyValue& kv : hosts->kvs) {
        auto member = decode_group_member(kv.value);
        if (!member || keys_.leaf(kv.key, members) == moving) continue;
        view.group_members[member->host] += 1;
        view.group_policies.insert(member->policy);
      }
      ++hosts;
    }
    for (; hosts != read->ranges.end(); ++hosts)
      for (const KeyValue& kv : hosts->kvs) {
        auto host = decode_host(kv.value);
        if (host && host->status == "READY") view.live.insert(host->provider);
      }
  }
  co_return view;
}

bool Placer::samplable(const PlacementQuery& query) {
  return std::all_of(query.params.begin(), query.params.end(), [](const auto& param) {
    return param.first == "resources" || param.first == "required" || param.first == "limit";
  });
}

awaitable<result<PlacementView>> Placer::sample(PlacementQuery query, int hosts, std::string from) {
  // From the point to the end of the host keys, then from their start: `hosts` in all.
  const std::string prefix = keys_.hosts_prefix(), start = keys_.host(from);
  std::vector<EtcdOp> reads{EtcdOp::get(start, prefix_range_end(prefix), hosts), EtcdOp::get(prefix, start, hosts)};
  std::vector<EtcdCompare> always;
  auto read = co_await txn_asking_again(etcd_, std::move(always), std::move(reads), config_.etcd.timeout);
  if (!read) co_return read.error();
  std::vector<HostRecord> picked;
  for (const RangeResult& range : read->ranges)
    for (const KeyValue& kv : range.kvs) {
      auto host = decode_host(kv.value);
      if (host && host->status == "READY" && picked.size() < size_t(hosts)) picked.push_back(std::move(*host));
    }
  // Traits need Placement's search; resources alone need only each host's usage beside the
  // capacity its record names (at 10,000 providers 8 ms a host, the search 21). A READY
  // record is no disabled host's.
  const bool traits = std::any_of(query.params.begin(), query.params.end(),
                                  [](const auto& param) { return param.first == "required"; });
  if (traits) query.params.emplace_back("required", "!" + std::string(disabled_trait));
  std::vector<result<Candidates>> answers(picked.size(), Error(errc::placement_unavailable));
  std::vector<awaitable<void>> asks;
  co_await placement_.preconnect();
  for (size_t i = 0; i < picked.size(); ++i) {
    if (!traits) {
      asks.push_back(ask_room(picked[i], query.resources, answers[i]));
      continue;
    }
    PlacementQuery one = query;
    one.params.emplace_back("in_tree", picked[i].provider);
    asks.push_back(ask_candidates(one.to_query_string(config_.placement.candidate_limit), answers[i]));
  }
  co_await run_together(std::move(asks));
  PlacementView view;
  std::optional<Error> unanswered;
  for (size_t i = 0; i < picked.size(); ++i) {
    if (!answers[i]) {
      unanswered = answers[i].error();
      continue;
    }
    view.live.insert(picked[i].provider);
    for (Allocations& request : answers[i]->allocation_requests)
      view.candidates.allocation_requests.push_back(std::move(request));
    view.candidates.provider_summaries.merge(answers[i]->provider_summaries);
  }
  // Unknown is not "no room": with nothing found, a host Placement did not answer about is an error.
  if (unanswered && view.candidates.allocation_requests.empty()) co_return *unanswered;
  co_return view;
}

awaitable<void> Placer::ask_candidates(std::string query, result<Candidates>& answer) {
  answer = co_await placement_.allocation_candidates(std::move(query), Duration{});
}

awaitable<void> Placer::ask_room(const HostRecord& host, const ResourceAmounts& asked, result<Candidates>& answer) {
  auto used = co_await placement_.usages(host.provider);
  if (!used) {
    answer = used.error();
    co_return;
  }
  answer = one_provider_candidates(host.provider, host.capacity, *used, asked);
}

std::vector<Choice> Placer::rank(const PlacementView& view, const WeighPolicy& policy, double random,
                                 std::optional<GroupPolicy> group) {
  std::vector<Choice> ranked = rank_candidates(view.candidates, view.live, policy, random);
  if (group) ranked = filter_for_group(std::move(ranked), *group, view.group_members);
  return ranked;
}

awaitable<result<Claim>> Placer::claim_first_fit(std::string uuid, std::vector<Choice> choices, ConsumerOwner owner) {
  for (const Choice& choice : choices) {
    for (int attempt = 1; attempt <= config_.schedule.max_claim_attempts; ++attempt) {
      auto claimed = co_await placement_.claim(uuid, *choice.allocations, owner);
      if (claimed) co_return Claim{choice.host, *choice.allocations};
      // A provider's generation moved (a claim beside ours), or a consumer of that uuid
      // came and went: the same choice again.
      if (claimed.error() == errc::placement_concurrent_update || claimed.error() == errc::placement_consumer_changed)
        continue;
      if (claimed.error() == errc::placement_capacity) break;
      co_return claimed.error();
    }
  }
  co_return Error(errc::no_allocations_left);
}

awaitable<result<Placer::Move>> Placer::move_allocation(std::string uuid, ConsumerAllocations read, Allocations to) {
  // It holds nothing: released meanwhile (destroy --force), and nothing is to be made anew.
  if (!read.generation || read.allocations.empty()) co_return Move::changed;
  if (read.allocations == to) co_return Move::moved;
  for (int attempt = 1; attempt <= config_.schedule.max_claim_attempts; ++attempt) {
    auto put = co_await placement_.replace(uuid, to, *read.generation, read.owner);
    if (put) co_return Move::moved;
    if (put.error() == errc::placement_capacity) co_return Move::no_room;
    // Someone else changed its allocations after they were read.
    if (put.error() == errc::placement_consumer_changed) co_return Move::changed;
    // A provider's generation moved (a claim beside ours): again.
    if (put.error() != errc::placement_concurrent_update) co_return put.error();
  }
  co_return Move::no_room;
}

awaitable<HandOverResult> Placer::hand_over(std::vector<Placed> placed, std::vector<EtcdCompare> guard,
                                            std::vector<EtcdOp> also, std::chrono::steady_clock::time_point deadline,
                                            std::optional<ReadBack> read_back) {
  std::vector<EtcdOp> writes = std::move(also);
  for (const Placed& one : placed) {
    const std::string& uuid = one.work.uuid;
    writes.push_back(EtcdOp::put(keys_.work(one.record.host, uuid), encode(one.work)));
    const std::string record = encode(one.record);
    for (std::string& key : keys_.record_keys(one.work.project, uuid)) writes.push_back(EtcdOp::put(std::move(key), record));
    if (one.work.group_policy && !one.work.group.empty())
      writes.push_back(EtcdOp::put(keys_.group_member(one.work.group, uuid),
                                   encode_group_member(one.record.host, *one.work.group_policy)));
  }
  // Our own write, to read back: the value we wrote, or a later one of that key (its agent
  // acted on it already), is ours; another's change of the guarded keys is not.
  // (`placed` outlives the commit; the value is made only if etcd does not answer, once.)
  const Placed& first = placed.front();
  if (!read_back) {
    read_back = ReadBack{keys_.work(first.record.host, first.work.uuid),
                         [&first, value = std::string()](const KeyValue& kv) mutable -> std::optional<int64_t> {
                           if (value.empty()) value = encode(first.work);
                           if (kv.value == value || kv.version > 1) return kv.create_revision;
                           return std::nullopt;
                         }};
  }
  co_return co_await commit(std::move(guard), std::move(writes), std::move(*read_back), deadline);
}

awaitable<HandOverResult> Placer::commit(std::vector<EtcdCompare> guard, std::vector<EtcdOp> writes, ReadBack probe,
                                         std::chrono::steady_clock::time_point deadline) {
  Backoff backoff(std::chrono::milliseconds(100), std::chrono::seconds(1));
  while (true) {
    auto txn = co_await etcd_.txn(guard, writes);
    if (txn) {
      if (txn->succeeded) co_return HandOverResult{HandOverResult::Outcome::committed, txn->revision, {}};
      co_return HandOverResult{HandOverResult::Outcome::refused, 0, {}};  // etcd said so
    }
    // Failed, or perhaps not: our own write tells.
    auto now = co_await etcd_.range(probe.key);
    if (now && !now->kvs.empty())
      if (auto revision = probe.ours(now->kvs.front()))
        co_return HandOverResult{HandOverResult::Outcome::committed, *revision, {}};
    if (std::chrono::steady_clock::now() >= deadline)
      co_return HandOverResult{HandOverResult::Outcome::unknown, 0, txn.error()};
    co_await backoff.wait();
  }
}

LookScope::LookScope(int sample, int shards)
    : sample_(std::max(sample, 0)), shards_(std::max(shards, 1)), rng_(random_seed()) {
  if (shards_ > 1) shard_ = another_shard();
}

std::string LookScope::another_shard() {
  std::uniform_int_distribution<int> pick(0, shards_ - 1);
  std::string shard = shard_trait(pick(rng_));
  while (int(asked_.size()) < shards_ && asked_.count(shard)) shard = shard_trait(pick(rng_));
  asked_.insert(shard);
  return shard;
}

std::string LookScope::describe() const {
  if (sample_ > 0) return fmt::format("{} hosts at random", sample_);
  return shard_.empty() ? std::string("the whole cloud") : "shard " + shard_;
}

bool LookScope::widen() {
  const std::string was = describe();
  if (sample_ > 0) {
    sample_ = 0;
  } else if (shard_.empty()) {
    return false;
  } else if (int(asked_.size()) < std::min(shard_tries, shards_)) {
    shard_ = another_shard();
  } else {
    shard_.clear();
  }
  spdlog::debug("no room among {}; asking about {}", was, describe());
  return true;
}

LookScope Placer::relocation_scope(const Relocation& move) const {
  return LookScope(0, move.to.empty() ? config_.placement.shards : 1);
}

awaitable<result<Placer::Homes>> Placer::homes(const Relocation& move, const LookScope& scope) {
  Homes out;
  const std::string& uuid = move.work.uuid;
  auto query = parse_placement_query(move.work.query);
  if (!query) co_return out;
  // Within the zone it was scheduled into; a named host only (Placement's own filter: it is
  // looked at however many hosts there are).
  if (!move.work.availability_zone.empty())
    query->params.emplace_back("member_of", availability_zone_aggregate(move.work.availability_zone));
  if (!move.to.empty()) query->params.emplace_back("in_tree", move.to);
  if (!scope.shard().empty()) query->params.emplace_back("required", scope.shard());
  // What it holds, read once: every write after is guarded by this reading, so of two moves
  // of one instance (two evacuations, an evacuation and a destroy --force) one wins.
  auto held = co_await placement_.consumer_allocations(uuid);
  if (!held) co_return held.error();
  if (!held->allocations.count(move.from)) {
    out.lost_race = true;
    co_return out;
  }
  out.held = std::move(*held);
  auto view = co_await look(std::move(*query), move.work.group, uuid);
  if (!view) co_return view.error();
  out.view = std::move(*view);
  if (!move.may_stay) out.view.live.erase(move.from);
  co_return out;
}

std::vector<Choice> Placer::Homes::choices(const Relocation& move, const WeighPolicy& policy) const {
  std::optional<GroupPolicy> group;
  if (!move.work.group.empty()) group = move.work.group_policy;
  return rank(view, policy, 0.0, group);
}

std::vector<EtcdCompare> Placer::relocation_guard(const Relocation& move, const std::string& host) const {
  std::vector<EtcdCompare> guard = move.also_require;
  guard.push_back(EtcdCompare::mod_revision_is(keys_.work(move.from, move.work.uuid), move.work_revision));
  // A host disabled since the look (a drain) takes nothing new: the drain counts on it.
  guard.push_back(EtcdCompare::absent(keys_.disabled(host)));
  return guard;
}

awaitable<result<Relocated>> Placer::relocate(Relocation move, InstanceRecord record) {
  LookScope scope = relocation_scope(move);
  for (;;) {
    auto tried = co_await relocate_within(move, record, scope);
    if (!tried || tried->outcome != Relocated::Outcome::no_room || !scope.widen()) co_return tried;
  }
}

awaitable<result<Relocated>> Placer::relocate_within(const Relocation& move, InstanceRecord record,
                                                     const LookScope& scope) {
  Relocated out;  // no room, unless it moves
  const std::string uuid = move.work.uuid;
  auto homes_found = co_await homes(move, scope);
  if (!homes_found) co_return homes_found.error();
  Homes& found = *homes_found;
  if (found.lost_race) out.outcome = Relocated::Outcome::lost_race;
  for (const Choice& choice : found.choices(move, weigh_policy())) {
    // 1. Its allocation, whole, to the chosen host.
    auto moved = co_await move_allocation(uuid, found.held, *choice.allocations);
    if (!moved) co_return moved.error();
    if (*moved == Move::no_room) continue;  // no room there after all
    if (*moved == Move::changed) {
      out.outcome = Relocated::Outcome::lost_race;
      co_return out;
    }
    // 2. Its work and record to that host, off `from`.
    out.host = choice.host;
    WorkSpec next = move.work;
    next.resources = choice.allocations->at(choice.host);
    record.host = choice.host;
    std::vector<EtcdOp> leave{EtcdOp::erase(keys_.work(move.from, uuid))};
    std::vector<Placed> placed{Placed{std::move(next), record}};
    HandOverResult txn =
        co_await hand_over(std::move(placed), relocation_guard(move, choice.host), std::move(leave), move.deadline);
    if (txn.outcome == HandOverResult::Outcome::committed) {
      out.outcome = Relocated::Outcome::moved;
      out.revision = txn.revision;
      co_return out;
    }
    // 3. Or its allocation back to `from`.
    if (txn.outcome == HandOverResult::Outcome::unknown) out.unknown = txn.error;
    out.outcome = co_await put_back(uuid, move.from, move.work.resources, *choice.allocations);
    co_return out;
  }
  co_return out;
}

awaitable<result<Relocated>> Placer::claim_move(Relocation move, MoveRecord record) {
  LookScope scope = relocation_scope(move);
  for (;;) {
    auto tried = co_await claim_move_within(move, record, scope);
    if (!tried || tried->outcome != Relocated::Outcome::no_room || !scope.widen()) co_return tried;
  }
}

awaitable<result<Relocated>> Placer::claim_move_within(const Relocation& move, const MoveRecord& record,
                                                       const LookScope& scope) {
  Relocated out;  // no room, unless it is claimed
  const std::string uuid = move.work.uuid;
  auto homes_found = co_await homes(move, scope);
  if (!homes_found) co_return homes_found.error();
  Homes& found = *homes_found;
  if (found.lost_race) out.outcome = Relocated::Outcome::lost_race;
  for (const Choice& choice : found.choices(move, weigh_policy())) {
    // 1. The books: the instance claims the chosen host, its migration consumer keeps `from`'s share.
    auto moved = co_await begin_move(uuid, record.migration, found.held, *choice.allocations);
    if (!moved) co_return moved.error();
    if (*moved == Move::no_room) continue;  // no room there after all
    if (*moved == Move::changed) {
      out.outcome = Relocated::Outcome::lost_race;
      co_return out;
    }
    // 2. The move record claimed, naming that host its destination.
    out.host = choice.host;
    MoveRecord claimed = record;
    claimed.destination = choice.host;
    claimed.state = MoveState::claimed;
    std::vector<EtcdOp> writes{EtcdOp::put(keys_.move(uuid), encode(claimed))};
    // Read back: this move, claimed for this host, at this or a later state.
    ReadBack ours{keys_.move(uuid), [claimed](const KeyValue& kv) -> std::optional<int64_t> {
                    auto now = decode_move(kv.value);
                    if (now && now->migration == claimed.migration && now->destination == claimed.destination)
                      return kv.mod_revision;
                    return std::nullopt;
                  }};
    HandOverResult txn =
        co_await commit(relocation_guard(move, choice.host), std::move(writes), std::move(ours), move.deadline);
    if (txn.outcome == HandOverResult::Outcome::committed) {
      out.outcome = Relocated::Outcome::moved;
      out.revision = txn.revision;
      co_return out;
    }
    // 3. Or the books swapped back, only those this claim moved, once the record changed (its
    // source's agent undid the move); one etcd did not tell of is left to that agent, which
    // undoes a move still preparing once it is overdue.
    if (txn.outcome == HandOverResult::Outcome::unknown) out.unknown = txn.error;
    out.outcome = Relocated::Outcome::stranded;
    if (txn.outcome == HandOverResult::Outcome::refused)
      if (auto back = co_await revert_move(uuid, record.migration)) out.outcome = Relocated::Outcome::put_back;
    co_return out;
  }
  co_return out;
}

awaitable<Relocated::Outcome> Placer::put_back(std::string uuid, std::string from, ResourceAmounts resources,
                                               std::optional<Allocations> put) {
  // Gone from its source: it moved on (our hand-over after all, or another's), or was destroyed.
  auto still = co_await etcd_.range(keys_.work(from, uuid));
  if (still && still->kvs.empty()) co_return Relocated::Outcome::lost_race;
  auto now = co_await placement_.consumer_allocations(uuid);
  // Released meanwhile (destroy --force): nothing is held to put back.
  if (still && now && now->allocations.empty()) co_return Relocated::Outcome::put_back;
  if (!still || !now || (put && now->allocations != *put)) co_return Relocated::Outcome::stranded;
  Allocations home{{from, std::move(resources)}};  // a named local: GCC 12 cannot keep a braced temporary
  auto back = co_await move_allocation(uuid, *now, std::move(home));
  co_return back && *back == Move::moved ? Relocated::Outcome::put_back : Relocated::Outcome::stranded;
}

awaitable<result<Placer::Move>> Placer::begin_move(std::string uuid, std::string migration, ConsumerAllocations held,
                                                   Allocations to) {
  if (!held.generation || held.allocations.empty()) co_return Move::changed;
  // The migration consumer is the instance's owner's, in the project's moving id: what counts
  // against the project's quota is its instances (model/projects.hpp).
  const ConsumerOwner moving{moving_project_id(held.owner.project), held.owner.user};
  std::vector<ConsumerWrite> writes{
      {uuid, std::move(to), held.generation, ConsumerType::instance, held.owner},
      {migration, std::move(held.allocations), std::nullopt, ConsumerType::migration, moving}};
  auto written = co_await placement_.write_together(std::move(writes));
  if (written) co_return Move::moved;
  if (written.error() == errc::placement_capacity) co_return Move::no_room;
  if (written.error() == errc::placement_consumer_changed) co_return Move::changed;
  co_return written.error();
}

awaitable<result<void>> Placer::finish_move(std::string migration) {
  for (int attempt = 1; attempt <= config_.schedule.max_claim_attempts; ++attempt) {
    auto held = co_await placement_.consumer_allocations(migration);
    if (!held) co_return held.error();
    if (!held->generation || held->allocations.empty()) co_return result<void>{};
    Allocations none;  // a named local: GCC 12 cannot keep a braced temporary in co_await
    auto released = co_await placement_.replace(migration, std::move(none), *held->generation, held->owner);
    if (released || released.error() != errc::placement_consumer_changed) co_return released;
  }
  co_return Error(errc::placement_consumer_changed, "the migration consumer " + migration + " kept changing");
}

awaitable<result<Placer::Move>> Placer::revert_move(std::string uuid, std::string migration) {
  auto [instance, kept] = co_await (placement_.consumer_allocations(uuid) &&
                                    placement_.consumer_allocations(migration));
  if (!instance) co_return instance.error();
  if (!kept) co_return kept.error();
  if (!kept->generation || kept->allocations.empty()) co_return Move::changed;
  const ConsumerOwner owner{instance_project_id(kept->owner.project), kept->owner.user};
  std::vector<ConsumerWrite> writes{
      {uuid, std::move(kept->allocations), instance->generation, ConsumerType::instance, owner},
      {migration, {}, kept->generation, ConsumerType::migration, kept->owner}};
  auto written = co_await placement_.write_together(std::move(writes));
  if (written) co_return Move::moved;
  if (written.error() == errc::placement_consumer_changed) co_return Move::changed;
  co_return written.error();
}

WeighPolicy Placer::weigh_policy(const std::string& policy_name) const {
  const ScheduleConfig& c = config_.schedule;
  WeighPolicy policy;
  policy.kind = parse_weigh_kind(policy_name.empty() ? c.policy : policy_name).value_or(WeighPolicy::Kind::spread);
  policy.ram_multiplier = c.ram_weight_multiplier;
  policy.cpu_multiplier = c.cpu_weight_multiplier;
  policy.disk_multiplier = c.disk_weight_multiplier;
  policy.host_subset_size = c.host_subset_size;
  return policy;
}

}  // namespace toyvm
