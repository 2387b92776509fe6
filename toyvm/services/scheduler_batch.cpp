// The scheduler service's batches (see scheduler_batch.hpp). The order of a batch: each
// project read once, every request checked alone (quota); each project's requests checked
// together against its quota; for each kind of request one look, a plan that gives each
// request its own room or none, and beside the looks the hold (one key an instance, under the
// service's lease); the claims, in parts that share no provider, sent at once; the quotas
// checked again with the claims counted; each request handed over in its own transaction with
// its reply, all at once.

#include "services/scheduler_batch.hpp"

#include "core/failpoint.hpp"
#include "model/txn_limits.hpp"
#include "model/uuid.hpp"
#include "services/placer.hpp"
#include "services/quota.hpp"
#include "services/schedule_plan.hpp"
#include "services/scheduler.hpp"

#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <random>

namespace toyvm {

ProjectReply reply_of(const Outcome& outcome, std::vector<std::string> lines) {
  ProjectReply reply;
  reply.lines = std::move(lines);
  reply.exit_code = outcome ? int(*outcome) : int(exit_code_for(outcome.error().code));
  if (!outcome) reply.error = outcome.error().message();
  return reply;
}

awaitable<void> answer_request(EtcdClient& etcd, std::vector<EtcdCompare> standing, std::string reply_key,
                               int64_t lease, const ProjectReply& reply) {
  std::vector<EtcdOp> put{EtcdOp::put(reply_key, encode(reply), lease)};
  auto written = co_await etcd.txn(std::move(standing), std::move(put));
  if (!written) spdlog::warn("scheduler: answering {}: {}", reply_key, written.error().message());
}

namespace {

// A batch's claims sent to Placement at once, at most: its workers take them side by side.
constexpr size_t claims_at_once = 2;

// How long a look made ahead stands in for a batch's own: a few batches' time.
constexpr auto look_ahead_fresh = std::chrono::milliseconds(250);

// One request of the batch, from its first read to its answer.
struct Entry {
  WaitingRequest waiting;
  RecordedSay said;
  std::unique_ptr<Scheduler> scheduler;
  Scheduler::Prepared prepared;
  std::vector<Claim> claims;
  // again: left for the service's next pass, a claim of its in Placement not given back.
  enum class Fate { open, answered, alone, again } fate = Fate::open;
  bool handed = false;  // its instances are in etcd, and its hold with them
};

class Batch {
 public:
  Batch(asio::io_context& io, const Config& config, std::shared_ptr<EtcdClient> etcd, Placement& placement,
        int64_t hold_lease, LooksAhead& ahead)
      : io_(io), config_(config), keys_(config.etcd.prefix), etcd_(std::move(etcd)), placement_(placement),
        placer_(placement, *etcd_, config), hold_lease_(hold_lease), ahead_(ahead) {}

  awaitable<std::vector<WaitingRequest>> run(std::vector<WaitingRequest> requests) {
    for (WaitingRequest& waiting : requests) {
      auto entry = std::make_unique<Entry>();
      entry->waiting = std::move(waiting);
      OnBehalf on_behalf{entry->waiting.standing, entry->waiting.reply_key, entry->waiting.kv.lease};
      entry->scheduler = std::make_unique<Scheduler>(io_, config_, entry->waiting.options, entry->said, etcd_,
                                                     std::move(on_behalf));
      entries_.push_back(std::move(entry));
    }
    // Where its time goes, for the debug log: each step's milliseconds.
    std::vector<std::pair<const char*, double>> steps;
    auto since = std::chrono::steady_clock::now();
    auto step = [&](const char* name) {
      const auto now = std::chrono::steady_clock::now();
      steps.emplace_back(name, std::chrono::duration<double, std::milli>(now - since).count());
      since = now;
    };
    co_await read_projects();
    std::vector<awaitable<void>> reads;
    for (auto& entry : entries_) reads.push_back(prepare(*entry));
    co_await run_together(std::move(reads));
    co_await check_quotas(false);
    step("read");
    // The hold needs nothing the look finds: it goes beside it. What the look leaves out is
    // let go with what is not handed over.
    std::vector<awaitable<void>> look_and_hold;
    look_and_hold.push_back(plan());
    look_and_hold.push_back(hold_open());
    co_await run_together(std::move(look_and_hold));
    step("look");
    if (!open().empty()) co_await claim();
    step("claim");
    if (!open().empty()) co_await check_quotas(true);
    for (const auto& [kind, looked] : looked_)
      if (looked.placed) start_look_ahead(kind, looked.query, looked.limit);
    std::vector<awaitable<void>> hand_overs;
    for (Entry* entry : open()) hand_overs.push_back(hand_over(*entry));
    co_await run_together(std::move(hand_overs));
    co_await drop_holds();
    step("hand-over");
    std::string timing;
    for (const auto& [name, ms] : steps) timing += fmt::format(" {} {:.1f} ms", name, ms);
    spdlog::debug("scheduler: a batch's steps:{}", timing);
    std::vector<WaitingRequest> alone;
    size_t placed = 0;
    for (auto& entry : entries_) {
      placed += entry->handed;
      if (entry->fate == Entry::Fate::alone) alone.push_back(std::move(entry->waiting));
    }
    spdlog::info("scheduler: {} request(s) together: {} placed, {} left to be taken alone", entries_.size(), placed,
                 alone.size());
    co_return alone;
  }

 private:
  std::vector<Entry*> open() const {
    std::vector<Entry*> out;
    for (const auto& entry : entries_)
      if (entry->fate == Entry::Fate::open) out.push_back(entry.get());
    return out;
  }

  awaitable<void> answer(Entry& entry, const Outcome& outcome) {
    entry.fate = Entry::Fate::answered;
    const ProjectReply reply = reply_of(outcome, std::move(entry.said.lines));  // not made in co_await's arguments (GCC 12)
    co_await answer_request(*etcd_, entry.waiting.standing, entry.waiting.reply_key, entry.waiting.kv.lease, reply);
  }

  // Each project the requests name, read once for all of them.
  awaitable<void> read_projects() {
    for (const auto& entry : entries_) projects_.emplace(entry->waiting.project, Error(errc::not_found));
    std::vector<awaitable<void>> reads;
    for (auto& [name, read] : projects_) reads.push_back(read_project_into(name, read));
    co_await run_together(std::move(reads));
  }

  awaitable<void> read_project_into(std::string name, result<ProjectStanding>& read) {
    read = co_await read_project(*etcd_, keys_, std::move(name));
  }

  // What a request asks, read and checked alone: a request refused alone is refused together.
  awaitable<void> prepare(Entry& entry) {
    auto ready = co_await entry.scheduler->prepare(projects_.at(entry.waiting.project));
    if (!ready) {
      const Outcome refused = ready.error();
      co_await answer(entry, refused);
      co_return;
    }
    entry.prepared = std::move(*ready);
  }

  // Each project's requests together within its quota, before the claim and after it (with
  // the claims counted: a schedule of another path may have raced them). A project that
  // does not fit, or whose use cannot be read, has its requests taken alone, in order, where
  // each is decided exactly; its claims made here are given back first.
  awaitable<void> check_quotas(bool counted) {
    std::map<std::string, std::vector<Entry*>> by_project;
    for (Entry* entry : open()) by_project[entry->prepared.project.name].push_back(entry);
    for (auto& [name, members] : by_project) {
      if (members.size() < 2 && !counted) continue;  // checked alone already
      ProjectUsage asked;
      for (Entry* entry : members) asked = plus(std::move(asked), entry->prepared.asked);
      auto fits = co_await check_quota(placement_, config_.placement, members.front()->prepared.project, asked, counted);
      if (fits) continue;
      spdlog::debug("scheduler: project {}'s requests together: {}; taking them alone", name, fits.error().message());
      for (Entry* entry : members) {
        if (counted) {
          co_await give_back_to_take_alone(*entry);
        } else {
          entry->fate = Entry::Fate::alone;
        }
      }
    }
  }

  // One look for each kind of request, and room for each request planned in it or none.
  awaitable<void> plan() {
    std::map<std::string, std::vector<Entry*>> by_kind;
    for (Entry* entry : open()) {
      const ScheduleOptions& o = entry->waiting.options;
      by_kind[fmt::format("{}\n{}\n{}", o.query, o.availability_zone, o.policy)].push_back(entry);
    }
    for (auto& [kind, members] : by_kind) {
      std::vector<size_t> counts;
      for (Entry* entry : members) counts.push_back(entry->prepared.uuids.size());
      const size_t instances = std::accumulate(counts.begin(), counts.end(), size_t(0));
      const PlacementQuery& query = members.front()->prepared.query;
      const int limit = query.limit > 0 ? 0 : std::max(config_.placement.candidate_limit, int(instances));
      Looked& looked = looked_[kind];
      looked.query = query;
      looked.limit = limit;
      auto view = co_await view_for(kind, query, limit);
      if (!view) spdlog::debug("scheduler: a batch's look: {}", view.error().message());
      auto plans = view ? plan_requests(std::move(*view), counts,
                                        placer_.weigh_policy(members.front()->waiting.options.policy), rng_)
                        : std::vector<std::optional<std::vector<Claim>>>(members.size());
      for (size_t i = 0; i < members.size(); ++i) {
        if (plans[i]) {
          members[i]->claims = std::move(*plans[i]);
          looked.placed = true;
        } else {
          members[i]->fate = Entry::Fate::alone;
        }
      }
    }
  }

  // The kind's look made ahead (waited for if on its way) if it asked for as many candidates
  // and is fresh, else one now.
  awaitable<result<PlacementView>> view_for(std::string kind, PlacementQuery query, int limit) {
    auto ahead = ahead_.by_kind.find(kind);
    if (ahead != ahead_.by_kind.end()) {
      const std::shared_ptr<LooksAhead::Look> look = std::move(ahead->second);
      ahead_.by_kind.erase(ahead);
      if (look->limit >= limit && std::chrono::steady_clock::now() - look->made < look_ahead_fresh) {
        error_code cancelled;
        if (!look->answer) co_await look->arrived.async_wait(asio::redirect_error(use_awaitable, cancelled));
        if (look->answer && *look->answer && std::chrono::steady_clock::now() - look->made < look_ahead_fresh)
          co_return std::move(**look->answer);
      }
    }
    co_return co_await look_now(placer_, config_, std::move(query), limit, rng_);
  }

  static awaitable<result<PlacementView>> look_now(Placer placer, const Config& config, PlacementQuery query,
                                                   int limit, std::mt19937_64& rng) {
    if (const int shards = config.placement.shards; shards > 1)
      query.params.emplace_back("required", shard_trait(std::uniform_int_distribution<int>(0, shards - 1)(rng)));
    co_return co_await placer.look(std::move(query), {}, {}, limit);
  }

  // A look for the next batch of this kind, once this one's claims are made; this batch ends
  // without waiting for it. It outlives the batch: it holds only what the service owns.
  static awaitable<void> look_ahead(Placer placer, const Config& config, PlacementQuery query,
                                    std::shared_ptr<LooksAhead::Look> look) {
    std::mt19937_64 rng{random_seed()};
    auto answer = co_await look_now(placer, config, std::move(query), look->limit, rng);
    look->answer = std::move(answer);
    look->arrived.cancel();
  }

  void start_look_ahead(const std::string& kind, const PlacementQuery& query, int limit) {
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(ahead_.by_kind, [&](const auto& one) { return now - one.second->made >= look_ahead_fresh; });
    auto look = std::make_shared<LooksAhead::Look>(io_, limit);
    // Waited for only while it would still be fresh: then a look of its own.
    look->arrived.expires_at(look->made + look_ahead_fresh);
    ahead_.by_kind[kind] = look;
    asio::co_spawn(io_, look_ahead(placer_, config_, query, std::move(look)), asio::detached);
  }

  // The claims of every planned instance, once held: one, or a few sent at once where the
  // requests touch no provider in common. A claim refused is nobody's: its requests are taken
  // alone. One whose answer was lost may have been made: it is given back.
  awaitable<void> claim() {
    if (!held_) {
      for (Entry* entry : open()) entry->fate = Entry::Fate::alone;
      co_return;
    }
    const std::vector<Entry*> planned = open();
    std::vector<std::vector<std::string>> providers;
    std::vector<size_t> sizes;
    for (Entry* entry : planned) {
      std::vector<std::string>& touched = providers.emplace_back();
      for (const Claim& claim : entry->claims)
        for (const auto& [rp, amounts] : claim.allocations) touched.push_back(rp);
      sizes.push_back(entry->claims.size());
    }
    co_await failpoint::pass("scheduler.batch_claim");  // looked and held, nothing claimed yet
    std::vector<awaitable<void>> claims;
    for (const std::vector<size_t>& part : split_claims(providers, sizes, claims_at_once)) {
      std::vector<Entry*> members;
      for (size_t i : part) members.push_back(planned[i]);
      claims.push_back(claim_together(std::move(members)));
    }
    co_await run_together(std::move(claims));
  }

  awaitable<void> claim_together(std::vector<Entry*> members) {
    std::vector<ConsumerWrite> writes;
    for (Entry* entry : members)
      for (size_t i = 0; i < entry->claims.size(); ++i)
        writes.push_back(ConsumerWrite{entry->prepared.uuids[i], entry->claims[i].allocations, std::nullopt,
                                       ConsumerType::instance, entry->prepared.owner});
    auto claimed = co_await placement_.write_together(std::move(writes));
    if (claimed) co_return;
    // A refusal for want of room wrote nothing. Any other failure may have written it all:
    // an answer lost on the way, or a consumer that exists already, which only this claim,
    // sent again after a timeout, can have made (its instances are this leader's). Given back
    // before they are taken alone, which plans anew.
    const bool nothing_written = claimed.error() == errc::placement_capacity ||
                                 claimed.error() == errc::placement_concurrent_update;
    spdlog::debug("scheduler: a batch's claim: {}; taking its requests alone", claimed.error().message());
    for (Entry* entry : members) {
      if (nothing_written) {
        entry->fate = Entry::Fate::alone;
      } else {
        co_await give_back_to_take_alone(*entry);
      }
    }
  }

  // A key an instance under the service's lease: `audit --fix` leaves their claims alone
  // while the service leads, and the hand-over requires and erases them. Nothing is claimed
  // without it.
  awaitable<void> hold_open() {
    std::vector<std::string> uuids;
    for (Entry* entry : open()) uuids.insert(uuids.end(), entry->prepared.uuids.begin(), entry->prepared.uuids.end());
    if (uuids.empty()) co_return;
    auto held = co_await hold(uuids);
    if (!held) spdlog::warn("scheduler: holding a batch's claims: {}", held.error().message());
    held_ = bool(held);
  }

  awaitable<result<void>> hold(const std::vector<std::string>& uuids) {
    held_uuids_ = uuids;
    std::vector<TxnCost> costs(uuids.size(), TxnCost{0, 1, keys_.claim(uuids.front()).size()});
    size_t first = 0;
    for (const size_t end : split_by_limits(costs).value_or(std::vector<size_t>{})) {
      std::vector<EtcdOp> puts;
      for (size_t i = first; i < end; ++i) puts.push_back(EtcdOp::put(keys_.claim(uuids[i]), "", hold_lease_));
      std::vector<EtcdCompare> always;
      auto put = co_await txn_asking_again(*etcd_, std::move(always), std::move(puts), config_.etcd.timeout);
      if (!put) co_return put.error();
      first = end;
    }
    co_return result<void>{};
  }

  // The holds of instances not handed over: to be taken alone (which holds them anew), or
  // given up (as a schedule taken alone lets its hold go).
  awaitable<void> drop_holds() {
    std::vector<EtcdOp> erases;
    for (const auto& entry : entries_) {
      if (entry->handed) continue;
      for (const std::string& uuid : entry->prepared.uuids)
        if (std::find(held_uuids_.begin(), held_uuids_.end(), uuid) != held_uuids_.end()) erases.push_back(EtcdOp::erase(keys_.claim(uuid)));
    }
    if (erases.empty()) co_return;
    std::vector<EtcdCompare> always;
    if (auto erased = co_await etcd_->txn(std::move(always), std::move(erases)); !erased)
      spdlog::warn("scheduler: a batch's holds: {}", erased.error().message());  // they go with the lease
  }

  // Its claims given back, it is taken alone. A claim of its uuids left in Placement would
  // be taken by that schedule for its own, wherever it chose: it waits for the next pass.
  awaitable<void> give_back_to_take_alone(Entry& entry) {
    bool given_back = true;
    for (const std::string& uuid : entry.prepared.uuids) {
      auto released = co_await placement_.release(uuid);
      if (released) continue;
      spdlog::error("releasing allocation {}: {}", uuid, released.error().message());
      given_back = false;
    }
    entry.fate = given_back ? Entry::Fate::alone : Entry::Fate::again;
  }

  awaitable<void> hand_over(Entry& entry) {
    auto outcome = co_await entry.scheduler->hand_over_claimed(entry.prepared, std::move(entry.claims));
    if (!outcome) {
      entry.fate = Entry::Fate::alone;  // a host disabled since the look; its claims given back
    } else if (*outcome && **outcome == ExitCode::ok) {
      entry.fate = Entry::Fate::answered;  // in its hand-over
      entry.handed = true;
    } else {
      co_await answer(entry, *outcome);
    }
  }

  asio::io_context& io_;
  const Config& config_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  Placement& placement_;
  Placer placer_;
  int64_t hold_lease_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::vector<std::string> held_uuids_;  // the instances it holds under the lease
  bool held_ = false;
  LooksAhead& ahead_;
  // Each kind's look: what it asked, and whether it placed anything (then looked at again ahead).
  struct Looked {
    PlacementQuery query;
    int limit = 0;
    bool placed = false;
  };
  std::map<std::string, Looked> looked_;
  std::mt19937_64 rng_{random_seed()};
  std::map<std::string, result<ProjectStanding>> projects_;  // by name, read once
};

}  // namespace

awaitable<std::vector<WaitingRequest>> schedule_together(asio::io_context& io, const Config& config,
                                                         std::shared_ptr<EtcdClient> etcd, Placement& placement,
                                                         int64_t hold_lease, LooksAhead& ahead,
                                                         std::vector<WaitingRequest> requests) {
  Batch batch(io, config, std::move(etcd), placement, hold_lease, ahead);
  co_return co_await batch.run(std::move(requests));
}

}  // namespace toyvm
