// toyvm schedule: claims resources in Placement and hands the instance to the chosen host
// through etcd. The claim is the commitment; the etcd write is create-only, and if it cannot
// be made the claim is released, so a failed schedule leaves nothing behind. While it runs, its
// hold (one key with a deadline it keeps moving on) and a key per instance naming it say its
// claims are still on their way (`audit --fix` leaves them alone until the deadline has passed,
// then erases the keys before it gives the claims back); the hand-over requires those keys, so
// once they are gone it cannot happen.
// Here: the run and its claims; the hand-over is in services/schedule_hand_over.cpp, the
// batch plan in services/schedule_plan.cpp, the guest data in services/guest_data.cpp.

#include "services/scheduler.hpp"

#include "core/failpoint.hpp"
#include "model/txn_limits.hpp"
#include "model/uuid.hpp"
#include "services/common.hpp"
#include "services/guest_data.hpp"
#include "services/schedule_plan.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>

namespace toyvm {

using namespace asio::experimental::awaitable_operators;

Scheduler::Scheduler(asio::io_context& io, const Config& config, const ScheduleOptions& options, Say& say,
                     std::shared_ptr<EtcdClient> etcd, std::optional<OnBehalf> on_behalf)
    : io_(io),
      config_(config),
      options_(options),
      say_(say),
      keys_(config.etcd.prefix),
      etcd_(etcd ? std::move(etcd) : EtcdClient::create(config.etcd)),
      placement_(io.get_executor(), config.placement),
      placer_(placement_, *etcd_, config),
      // Checked on the command line to be one of the three.
      group_policy_(options.group.empty() ? std::nullopt : parse_group_policy(options.group_policy)),
      on_behalf_(std::move(on_behalf)) {}

result<Scheduler::Prepared> Scheduler::read_request() const {
  auto query = parse_placement_query(options_.query);
  if (!query) return query.error().doing("invalid query");
  if (!options_.group.empty() && !is_group_name(options_.group))
    return Error(errc::invalid_argument, fmt::format("bad group name '{}' (1 to 64 of A-Z a-z 0-9 _ . -)", options_.group));
  if (!options_.availability_zone.empty())
    query->params.emplace_back("member_of", availability_zone_aggregate(options_.availability_zone));
  Prepared asked;
  asked.query = std::move(*query);
  if (auto read = read_guest_data(options_, asked.spec); !read) return read.error();
  return asked;
}

awaitable<result<Scheduler::Prepared>> Scheduler::admit(Prepared asked, std::optional<result<ProjectStanding>> project) {
  if (project) {
    if (!*project) co_return with_endpoints(*etcd_, project->error());
    project_ = std::move(**project);
  } else {
    // Read with the hold, beside the first look (first_look): no round trip to etcd before
    // Placement is asked.
    if (auto valid = check_project_name(project_name()); !valid) co_return valid.error();
    project_ = ProjectStanding{project_name(), {}, 0};
    project_unread_ = true;
  }
  owner_ = ConsumerOwner{placement_project_id(config_.placement.consumer_project, project_.name),
                         options_.user.empty() ? asking_user(config_) : options_.user};
  // Checked before anything is claimed: an instance etcd cannot take in one request could
  // never be handed over, and its claim would only have to be given back.
  const int count = std::max(1, options_.count);
  const Placed biggest = instance(asked.spec, new_uuid(), count - 1, new_uuid(), {});  // its host not known yet
  if (const TxnCost one = hand_over_cost(keys_, biggest.work, biggest.record); !split_by_limits({one}))
    co_return Error(errc::invalid_argument,
                    fmt::format("the instance's data ({} bytes with its user data and keys) is more than etcd takes "
                                "in one request ({} bytes)", one.bytes, etcd_request_budget));

  asked_.instances = count;
  for (const auto& [rc, amount] : asked.query.resources) asked_.amounts[rc] = amount * count;
  // Nothing is claimed for a request its project's quota refuses (a project read with the
  // hold is checked in first_look).
  if (!project_unread_) {
    if (auto fits = co_await check_quota(placement_, config_.placement, project_, asked_, false); !fits)
      co_return fits.error();
  }
  asked.uuids = options_.uuids;
  asked.uuids.resize(size_t(count));
  for (std::string& uuid : asked.uuids)
    if (uuid.empty()) uuid = new_uuid();
  asked.project = project_;
  asked.asked = asked_;
  asked.owner = owner_;
  co_return asked;
}

awaitable<Outcome> Scheduler::run() {
  auto asked = read_request();
  if (!asked) co_return asked.error();
  auto membership = co_await caller_membership(*etcd_, keys_, config_.etcd, options_.project);
  if (!membership) co_return with_endpoints(*etcd_, membership.error());
  if (*membership) {
    member_ = std::move(*membership);
    co_return co_await ask_service(std::move(asked->spec));
  }
  auto ready = co_await admit(std::move(*asked), std::nullopt);
  if (!ready) co_return ready.error();
  // Spread over a few hosts at random is the best of a few random choices, which balances a
  // cloud nearly as well as the best of all; packing wants the fullest host of all, so it asks all.
  const bool sampled = ready->uuids.size() == 1 && options_.group.empty() && Placer::samplable(ready->query) &&
                       placer_.weigh_policy(options_.policy).kind == WeighPolicy::Kind::spread;
  scope_ = LookScope(sampled ? config_.placement.sample_hosts : 0, config_.placement.shards);
  auto placed = co_await (place(std::move(ready->query), std::move(ready->spec), std::move(ready->uuids)) ||
                          keep_holding());
  co_return std::get<0>(placed);
}

awaitable<result<Scheduler::Prepared>> Scheduler::prepare(std::optional<result<ProjectStanding>> project) {
  auto asked = read_request();
  if (!asked) co_return asked.error();
  if (!project) project = co_await read_project(*etcd_, keys_, project_name());
  co_return co_await admit(std::move(*asked), std::move(project));
}

awaitable<std::optional<Outcome>> Scheduler::hand_over_claimed(const Prepared& prepared, std::vector<Claim> claims) {
  uuids_ = prepared.uuids;
  claiming_ = true;
  std::vector<WorkSpec> specs;
  std::vector<InstanceRecord> records;
  HandOver handed = co_await hand_over_claims(prepared.spec, prepared.uuids, claims, specs, records);
  if (!handed.disabled_host.empty() && handed.handed == 0) {
    co_await release_all(prepared.uuids);
    co_return std::nullopt;
  }
  co_return co_await settle(std::move(handed), prepared.uuids, std::move(specs), std::move(records));
}

awaitable<Scheduler::HandOver> Scheduler::hand_over_claims(const WorkSpec& spec, const std::vector<std::string>& uuids,
                                                           const std::vector<Claim>& claims,
                                                           std::vector<WorkSpec>& specs,
                                                           std::vector<InstanceRecord>& records) {
  specs.clear();
  records.clear();
  for (size_t i = 0; i < uuids.size(); ++i) {
    const Claim& claim = claims[i];
    Placed one = instance(spec, uuids[i], int(i), claim.host, claim.allocations.at(claim.host));
    specs.push_back(std::move(one.work));
    records.push_back(std::move(one.record));
  }
  co_await failpoint::pass("schedule.hand_over");  // claimed, not yet handed over
  co_return co_await hand_over(specs, records);
}

awaitable<Outcome> Scheduler::place(PlacementQuery query, WorkSpec spec, std::vector<std::string> uuids) {
  const int count = int(uuids.size());
  uuids_ = uuids;
  HandOver handed;
  std::vector<WorkSpec> specs;
  std::vector<InstanceRecord> records;
  // A host disabled between the look and the hand-over (a drain) refuses the instances: their
  // claims go back and they are placed again, elsewhere, as the next look leaves it out.
  for (int round = 1;; ++round) {
    result<std::vector<Claim>> claims = Error(errc::no_allocations_left);
    if (count == 1) {
      claims = co_await claim_one(query, uuids.front());
    } else {
      claims = co_await claim_batch(query, uuids);
    }
    if (!claims) {
      co_await let_go();
      if (claims.error() == errc::no_allocations_left) {
        say_.line("NO ALLOCATIONS LEFT");
        co_return ExitCode::no_allocations;
      }
      // A claim whose answer was lost may have been made.
      if (!is_etcd_error(claims.error()) && claiming_) co_await release_all(uuids);
      co_return with_endpoints(*etcd_, claims.error());
    }
    spdlog::debug("schedule: claimed {} instance(s)", count);
    // Again with the claims counted: of requests that raced for the project's last room, those
    // left above its quota give their claims back.
    if (auto fits = co_await check_quota(placement_, config_.placement, project_, asked_, true); !fits) {
      co_await release_all(uuids);
      co_await let_go();
      co_return with_endpoints(*etcd_, fits.error());
    }
    handed = co_await hand_over_claims(spec, uuids, *claims, specs, records);
    if (handed.disabled_host.empty() || handed.handed > 0 || round >= config_.schedule.max_claim_attempts) break;
    spdlog::info("schedule: host {} was disabled before the hand-over; placing again", handed.disabled_host);
    co_await release_all(uuids);
  }
  if (handed.error.code) co_await let_go();  // nothing more of this schedule's is on its way
  held_ = false;  // its keys went with the hand-over
  co_return co_await settle(std::move(handed), std::move(uuids), std::move(specs), std::move(records));
}

awaitable<Outcome> Scheduler::settle(HandOver handed, std::vector<std::string> uuids, std::vector<WorkSpec> specs,
                                     std::vector<InstanceRecord> records) {
  if (handed.error.code) co_return co_await give_up_hand_over(handed, uuids, specs, records);
  spdlog::debug("schedule: handed over through etcd");
  for (const InstanceRecord& record : records)
    say_.line(fmt::format("NOTIFIED TARGET, {}, OF INSTANCE {}", record.host, record.uuid));
  if (!options_.wait) co_return ExitCode::ok;
  if (uuids.size() == 1) {
    auto settled = co_await wait_until_settled(uuids.front(), handed.revision);
    if (!settled) co_return settled.error();
    co_return ExitCode::ok;
  }
  // Of a batch, each instance that does not settle is told as it happens; the outcome is the
  // worst of them (a failure outranks an instance that is only missing its address).
  std::optional<Error> worst;
  size_t unsettled = 0;
  for (const std::string& uuid : uuids) {
    auto settled = co_await wait_until_settled(uuid, handed.revision);
    if (settled) continue;
    say_.note(settled.error().message());
    ++unsettled;
    if (!worst || *worst == errc::no_address) worst = settled.error();
  }
  if (!worst) co_return ExitCode::ok;
  co_return Error(worst->code, fmt::format("{} of {} instances did not settle as asked", unsettled, uuids.size()));
}

awaitable<result<void>> Scheduler::hold_claims() {
  const std::string hold = hold_key();
  const std::string named = encode_hold_name(uuids_.front());
  std::vector<EtcdOp> project_read;
  if (project_unread_) project_read = project_reads(keys_, project_.name);
  std::vector<TxnCost> costs(uuids_.size(), TxnCost{1, 1, keys_.claim(uuids_.front()).size() + named.size()});
  costs.front().ops += 1 + int(project_read.size());
  costs.front().bytes += hold.size() + 16;
  for (const EtcdOp& read : project_read) costs.front().bytes += read.key.size();
  hold_ends_ = split_by_limits(costs).value_or(std::vector<size_t>{});
  hold_revisions_.assign(hold_ends_.size(), 0);
  held_ = true;
  size_t first = 0;
  for (size_t group = 0; group < hold_ends_.size(); ++group) {
    std::vector<EtcdOp> puts;
    if (group == 0) {
      puts.push_back(EtcdOp::put(hold, encode_hold(unix_millis() + claim_hold_ttl_s * 1000)));
      puts.insert(puts.end(), std::make_move_iterator(project_read.begin()), std::make_move_iterator(project_read.end()));
    }
    for (size_t i = first; i < hold_ends_[group]; ++i) puts.push_back(EtcdOp::put(keys_.claim(uuids_[i]), named));
    std::vector<EtcdCompare> always;
    auto put = co_await txn_asking_again(*etcd_, std::move(always), std::move(puts), config_.etcd.timeout);
    if (!put) co_return put.error();
    hold_revisions_[group] = put->revision;
    if (group == 0 && project_unread_) {
      auto standing = project_standing(project_.name, put->ranges);
      if (!standing) co_return standing.error();  // let go of by the caller
      project_ = std::move(*standing);
    }
    if (group == 0) hold_revision_ = put->revision;
    first = hold_ends_[group];
  }
  co_return result<void>{};
}

awaitable<void> Scheduler::keep_holding() {
  asio::steady_timer timer(io_);
  while (true) {
    timer.expires_after(std::chrono::seconds(claim_hold_ttl_s) / 3);
    co_await timer.async_wait(use_awaitable);
    if (held_) co_await renew_hold();
  }
}

awaitable<void> Scheduler::renew_hold() {
  if (hold_revision_ == 0) co_return;
  const std::string hold = hold_key();
  std::vector<EtcdCompare> as_written{EtcdCompare::mod_revision_is(hold, hold_revision_)};
  std::vector<EtcdOp> put{EtcdOp::put(hold, encode_hold(unix_millis() + claim_hold_ttl_s * 1000))};
  auto written = co_await etcd_->txn(std::move(as_written), std::move(put));
  // One not answered is tried again next time, while the deadline lasts.
  if (written) hold_revision_ = written->succeeded ? written->revision : 0;
}

awaitable<void> Scheduler::let_go() {
  if (!std::exchange(held_, false)) co_return;
  size_t first = 0;
  for (size_t group = 0; group < hold_ends_.size(); ++group) {
    if (hold_revisions_[group] != 0) {
      std::vector<EtcdCompare> as_written;
      std::vector<EtcdOp> erase;
      for (size_t i = first; i < hold_ends_[group]; ++i) {
        as_written.push_back(EtcdCompare::mod_revision_is(keys_.claim(uuids_[i]), hold_revisions_[group]));
        erase.push_back(EtcdOp::erase(keys_.claim(uuids_[i])));
      }
      auto erased = co_await etcd_->txn(std::move(as_written), std::move(erase));
      if (!erased) spdlog::debug("schedule: claims not let go: {}", erased.error().message());
      hold_revisions_[group] = 0;
    }
    first = hold_ends_[group];
  }
  // After the claims, which it stands for while any is left; one not erased lapses at its
  // deadline, and `audit --fix` takes it away.
  hold_revision_ = 0;
  std::string hold = hold_key();
  auto erased = co_await etcd_->erase(std::move(hold));
  if (!erased) spdlog::debug("schedule: hold not let go: {}", erased.error().message());
}

awaitable<result<PlacementView>> Scheduler::first_look(PlacementQuery query, int limit) {
  if (held_) co_return co_await look(std::move(query), limit);  // placed again: the hold stands
  // Placement's connection first, so that the look's request leaves before the hold makes
  // etcd's channel (gRPC's start takes this thread for a while).
  co_await placement_.preconnect();
  auto [view, held] = co_await (look(std::move(query), limit) && hold_claims());
  if (!held) co_return held.error();
  if (std::exchange(project_unread_, false)) {
    if (auto fits = co_await check_quota(placement_, config_.placement, project_, asked_, false); !fits)
      co_return fits.error();
  }
  co_return std::move(view);
}

awaitable<result<PlacementView>> Scheduler::look(PlacementQuery query, int limit) {
  spdlog::debug("schedule: asking etcd and Placement about {}", scope_.describe());
  if (scope_.sample() > 0) co_return co_await placer_.sample(std::move(query), scope_.sample(), new_uuid());
  if (!scope_.shard().empty()) query.params.emplace_back("required", scope_.shard());
  // A batch's look waits as long as its claim may: behind other batches' claims in a busy
  // Placement, which is no Placement out of reach (a look given up is still answered, for nothing).
  const Duration timeout = uuids_.size() > 1 ? placement_.batch_timeout(uuids_.size()) : Duration{};
  auto view = co_await placer_.look(std::move(query), options_.group, {}, limit, timeout);
  if (!view) co_return view.error();
  for (GroupPolicy policy : view->group_policies) {
    if (policy != group_policy()) {
      co_return Error(errc::invalid_argument, fmt::format("server group {} has policy {}, not {}", options_.group,
                                                          to_string(policy), options_.group_policy));
    }
  }
  spdlog::debug("schedule: {} candidates, {} live hosts", view->candidates.allocation_requests.size(),
                view->live.size());
  co_return view;
}

awaitable<result<std::vector<Claim>>> Scheduler::claim_one(PlacementQuery query, std::string uuid) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::mt19937_64 rng{random_seed()};
  auto view = co_await first_look(query, 0);
  while (true) {
    if (!view) co_return view.error();
    auto ranked = placer_.rank(*view, placer_.weigh_policy(options_.policy), uniform(rng), group_policy());
    claiming_ = true;
    auto claim = co_await placer_.claim_first_fit(uuid, std::move(ranked), owner_);
    if (claim) co_return std::vector<Claim>{std::move(*claim)};
    if (claim.error() != errc::no_allocations_left || !scope_.widen()) co_return claim.error();
    view = co_await look(query, 0);
  }
}

awaitable<result<std::vector<Claim>>> Scheduler::claim_batch(PlacementQuery query,
                                                             const std::vector<std::string>& uuids) {
  const bool own_limit = query.limit > 0;
  int limit = std::max<int>(config_.placement.candidate_limit, int(uuids.size()));
  std::mt19937_64 rng{random_seed()};
  for (int round = 1;; ++round) {
    result<PlacementView> view = Error(errc::no_allocations_left);
    if (round == 1) {
      view = co_await first_look(query, limit);
    } else {
      view = co_await look(query, limit);
    }
    if (!view) co_return view.error();
    const bool truncated = !own_limit && view->candidates.allocation_requests.size() >= size_t(limit);
    auto plan = plan_batch(std::move(*view), uuids.size(), placer_.weigh_policy(options_.policy), group_policy(), rng);
    if (!plan) {
      if (truncated) {
        limit *= 4;  // the rest of the cloud may have room
      } else if (!scope_.widen()) {
        co_return Error(errc::no_allocations_left);
      }
      continue;
    }
    std::vector<std::pair<std::string, Allocations>> consumers;
    for (size_t i = 0; i < uuids.size(); ++i) consumers.emplace_back(uuids[i], (*plan)[i].allocations);
    claiming_ = true;
    auto claimed = co_await placement_.claim_all(std::move(consumers), owner_);
    if (claimed) co_return std::move(*plan);
    // Not a consumer that changed: this schedule's fresh uuids then hold what an earlier try of
    // its own left (a POST sent again after its answer was lost, made with another plan), which
    // no plan can race; the claims are given back.
    const bool raced = claimed.error() == errc::placement_capacity ||
                       claimed.error() == errc::placement_concurrent_update;
    if (!raced || round >= config_.schedule.max_claim_attempts * 4) co_return claimed.error();
    spdlog::debug("schedule: another claim came first ({}); planning again", claimed.error().message());
    // Apart, so that batches racing for the same room do not meet again at once.
    std::uniform_int_distribution<int> jitter(0, 20 * std::min(round, 10));
    asio::steady_timer timer(io_, std::chrono::milliseconds(jitter(rng)));
    co_await timer.async_wait(use_awaitable);
  }
}

awaitable<void> Scheduler::release_all(const std::vector<std::string>& uuids) {
  for (const std::string& uuid : uuids) {
    if (auto released = co_await placement_.release(uuid); !released)
      spdlog::error("releasing allocation {}: {}", uuid, released.error().message());
  }
}

awaitable<Outcome> Scheduler::ask_service(WorkSpec spec) {
  if (member_->role != ProjectRole::member)
    co_return Error(errc::permission_denied, fmt::format("a reader of project {} cannot schedule", member_->project));
  ProjectRequest request = schedule_request(options_, config_.etcd.user, std::move(spec.user_data),
                                            std::move(spec.keys));
  auto reply = co_await toyvm::ask_service(*etcd_, keys_, member_->project, std::move(request), service_timeout);
  if (!reply) co_return with_endpoints(*etcd_, reply.error());
  Outcome outcome = reply_outcome(*reply, say_);
  if (!outcome || *outcome != ExitCode::ok || !options_.wait) co_return outcome;
  int64_t since = 0;  // the views are followed from what they hold now
  for (const std::string& uuid : reply->instances)
    if (auto settled = co_await wait_until_settled(uuid, since); !settled) co_return settled.error();
  co_return ExitCode::ok;
}

Placed Scheduler::instance(const WorkSpec& guest, std::string uuid, int index, std::string host,
                           ResourceAmounts resources) const {
  Placed one{guest, {}};
  WorkSpec& work = one.work;
  work.uuid = std::move(uuid);
  work.name = options_.count <= 1 || options_.name.empty() ? options_.name
                                                           : fmt::format("{}-{}", options_.name, index + 1);
  work.project = project_.name;
  work.user = owner_.user;
  work.image = options_.image.empty() ? config_.schedule.image : options_.image;
  work.image_sha256 = options_.image_sha256;
  work.image_format = options_.image_format;
  work.query = options_.query;
  work.availability_zone = options_.availability_zone;
  work.resources = std::move(resources);
  work.config_drive = options_.config_drive;
  work.group = options_.group;
  work.group_policy = group_policy();
  work.created_at = unix_seconds();
  InstanceRecord& record = one.record;
  record.uuid = work.uuid;
  record.name = work.name;
  record.project = work.project;
  record.host = std::move(host);
  record.state = InstanceState::scheduled;
  record.updated_at = unix_millis();
  return one;
}

Outcome run_schedule(const Config& config, const ScheduleOptions& options, Say& say) {
  return run_on_loop([&](asio::io_context& io) -> awaitable<Outcome> {
    Scheduler scheduler(io, config, options, say);
    co_return co_await scheduler.run();
  });
}

}  // namespace toyvm
