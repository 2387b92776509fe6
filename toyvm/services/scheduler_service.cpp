// toyvm scheduler: the long-running service that acts for projects' members, as Nova's and
// Kubernetes' schedulers do. Members reach only their project's keys (etcd's roles, see
// model/access.hpp); they put requests there (`requests/<project>/<id>`), and the service,
// holding the cloud's credentials, reads them, checks the project's quota, claims in
// Placement and hands over through etcd, for the project the key names, and answers in
// `replies/<project>/<id>`.
//
// Several may run; one leads (an etcd election: `scheduler/leader`, created under its lease)
// and takes what waits in passes: the schedules that can go together in batches, two at once
// with each project's in one (services/scheduler_batch.hpp), the rest one at a time, so a
// project's quota is checked with nothing of that project between its check and its claim.
// A pass waits a moment for as many requests as the last one answered (their members ask
// again at once), so that a stream of members keeps its batches whole. A request's instances
// have the same uuids at every try (model/uuid.hpp), its reply is written in the very transaction that hands them
// over, and that transaction requires the leader's key as this leader made it: a leader that
// lost its lease hands nothing over, and one that takes over a request finds what another left
// (its instances, answered from their records; its claims, given back before claiming again).

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "core/stop.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "model/requests.hpp"
#include "model/uuid.hpp"
#include "services/common.hpp"
#include "services/instance_lookup.hpp"
#include "services/scheduler.hpp"
#include "services/schedule_plan.hpp"
#include "services/scheduler_batch.hpp"
#include "services/services.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>

namespace toyvm {
namespace {

using namespace asio::experimental::awaitable_operators;

constexpr int64_t leader_ttl_s = 10;

// At most this many requests are taken in one pass (a batch): the rest wait for the next.
constexpr size_t max_batch = 128;
constexpr size_t batches_in_flight = 2;

// How long a pass waits for the requests of those the last one answered: their members ask
// again within an etcd write or two, and a pass of the first few alone would leave the rest a
// pass of their own, each paying for its look and its claim (Placement's cost is a request's
// as well as a consumer's).
constexpr auto gather_window = std::chrono::milliseconds(20);

class SchedulerService {
 public:
  SchedulerService(asio::io_context& io, const Config& config, std::string name)
      : io_(io),
        config_(config),
        name_(std::move(name)),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        placement_(io.get_executor(), config.placement) {}

  awaitable<Outcome> run() {
    asio::signal_set signals(io_, SIGINT, SIGTERM);
    // A stop hands the lead over at once (its key goes with its lease) and ends the loop
    // wherever it waits: a request half done is the next leader's, as after a crash.
    signals.async_wait([this](const error_code& ec, int) {
      if (ec) return;
      stop_.request();
      asio::co_spawn(io_, step_down(), asio::detached);
    });
    while (!stop_.requested()) {
      auto led = co_await campaign();
      if (!led) {
        spdlog::warn("scheduler: {}; trying again", led.error().message());
        co_await stop_.sleep(std::chrono::seconds(1));
      }
    }
    spdlog::info("scheduler: stopped");
    co_return ExitCode::ok;
  }

 private:
  // One election: leads while its lease lives, or waits for the leader's key to go.
  awaitable<result<void>> campaign() {
    auto lease = co_await etcd_->lease_grant(leader_ttl_s);
    if (!lease) co_return lease.error();
    std::vector<EtcdCompare> vacant{EtcdCompare::absent(keys_.scheduler_leader())};
    std::vector<EtcdOp> take{EtcdOp::put(keys_.scheduler_leader(), name_, *lease)};
    std::vector<EtcdOp> look{EtcdOp::get(keys_.scheduler_leader())};
    auto elected = co_await etcd_->txn(std::move(vacant), std::move(take), std::move(look));
    if (!elected) co_return elected.error();
    if (!elected->succeeded) {
      co_await etcd_->lease_revoke(*lease);
      int64_t since = elected->revision + 1;
      auto gone = [](const WatchEvent& event) { return event.type == WatchEvent::Type::erase; };
      auto waited = co_await follow_key(*etcd_, keys_.scheduler_leader(), since, std::chrono::seconds(leader_ttl_s), gone);
      if (!waited) co_return waited.error();
      co_return result<void>{};
    }
    spdlog::info("scheduler: {} leads (revision {})", name_, elected->revision);
    term_ = elected->revision;
    lease_ = *lease;
    if (auto mended = co_await mend_views(); !mended)
      spdlog::warn("scheduler: mending projects' views: {}", mended.error().message());
    leading_ = true;
    made_.clear();
    auto ended = co_await (keep_leading(*lease) || (serve() && relay_consoles() && count_requests()));
    if (ended.index() == 0 && !stop_.requested())
      spdlog::warn("scheduler: {} lost its lease; it no longer leads", name_);
    if (std::exchange(lease_, 0)) co_await etcd_->lease_revoke(*lease);
    co_return result<void>{};
  }

  // Every instance record with its project's view, and no view without its record: every
  // writer writes both at once, but records made before projects have none (the default
  // project's, seen by its members once this has run). Each fix is guarded by what was read;
  // a record that cannot be read keeps whatever view it has.
  awaitable<result<void>> mend_views() {
    const std::string views_root = keys_.prefix() + "/project-instances/";
    std::vector<EtcdOp> reads{EtcdOp::get(keys_.instances_prefix(), prefix_range_end(keys_.instances_prefix())),
                              EtcdOp::get(views_root, prefix_range_end(views_root))};
    std::vector<EtcdCompare> always;
    auto read = co_await etcd_->txn(std::move(always), std::move(reads));
    if (!read) co_return read.error();
    std::map<std::string, const KeyValue*> records, views;  // by uuid; by key
    for (const KeyValue& kv : read->ranges[0].kvs) records[kv.key.substr(keys_.instances_prefix().size())] = &kv;
    for (const KeyValue& kv : read->ranges[1].kvs) views[kv.key] = &kv;
    size_t mended = 0;
    std::set<std::string> wanted;
    for (const auto& [uuid, kv] : records) {
      auto record = decode_instance(kv->value);
      if (!record) continue;
      const std::string view = keys_.project_instance(record->project, uuid);
      wanted.insert(view);
      auto now = views.find(view);
      if (now != views.end() && now->second->value == kv->value) continue;
      std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(kv->key, kv->mod_revision),
                                       now == views.end() ? EtcdCompare::absent(view)
                                                          : EtcdCompare::mod_revision_is(view, now->second->mod_revision)};
      std::vector<EtcdOp> put{EtcdOp::put(view, kv->value)};
      auto fixed = co_await etcd_->txn(std::move(as_read), std::move(put));
      if (!fixed) co_return fixed.error();
      mended += fixed->succeeded;
    }
    for (const auto& [key, kv] : views) {
      if (wanted.count(key)) continue;
      const std::string uuid = key.substr(key.rfind('/') + 1);
      auto record = records.find(uuid);
      if (record != records.end() && !decode_instance(record->second->value)) continue;  // unknown, not absent
      std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(key, kv->mod_revision)};
      as_read.push_back(record == records.end() ? EtcdCompare::absent(keys_.instance(uuid))
                                                : EtcdCompare::mod_revision_is(record->second->key,
                                                                               record->second->mod_revision));
      std::vector<EtcdOp> erase{EtcdOp::erase(key)};
      auto fixed = co_await etcd_->txn(std::move(as_read), std::move(erase));
      if (!fixed) co_return fixed.error();
      mended += fixed->succeeded;
    }
    if (mended > 0) spdlog::info("scheduler: mended {} project view(s) of instance records", mended);
    co_return result<void>{};
  }

  awaitable<void> step_down() {
    if (const int64_t lease = std::exchange(lease_, 0)) co_await etcd_->lease_revoke(lease);
    spdlog::info("scheduler: {} stopped", name_);
    io_.stop();
  }

 public:
  bool stopped() const { return stop_.requested(); }

 private:
  // Returns when the lease is gone, or may be (no keep-alive answered for a lease's time: an
  // etcd away that long), or the service stops; then ends the term's waits. Leading on while
  // unsure is safe: every hand-over requires the leader's key as this leader made it.
  awaitable<void> keep_leading(int64_t lease) {
    std::unique_ptr<EtcdLeaseKeeper> keeper = etcd_->keep_alive(lease);
    auto answered = std::chrono::steady_clock::now();
    while (co_await stop_.sleep(std::chrono::seconds(leader_ttl_s) / 3)) {
      auto ttl = co_await keeper->ping();
      if (ttl && *ttl == 0) break;
      if (ttl) {
        answered = std::chrono::steady_clock::now();
        continue;
      }
      if (std::chrono::steady_clock::now() - answered >= std::chrono::seconds(leader_ttl_s)) break;
      keeper = etcd_->keep_alive(lease);  // a new stream after an error
    }
    end_term();
  }

  // etcd's watches do not heed a cancel: a term's waits are ended by aborting their watches.
  void end_term() {
    leading_ = false;
    for (EtcdWatch* watch : watches_) watch->abort();
    arrivals_.cancel();
  }

  // The requests without a reply, one at a time, oldest first; then waits for more.
  awaitable<void> serve() {
    size_t last_pass = 0;  // the requests the last pass took
    std::optional<std::chrono::steady_clock::time_point> gathering;  // until then, while fewer wait
    while (leading_) {
      std::vector<EtcdOp> reads{EtcdOp::get(keys_.requests_root(), prefix_range_end(keys_.requests_root())),
                                EtcdOp::get(keys_.replies_root(), prefix_range_end(keys_.replies_root()))};
      std::vector<EtcdCompare> always;
      auto listed = co_await etcd_->txn(std::move(always), std::move(reads));
      if (!listed) {
        spdlog::warn("scheduler: listing requests: {}", listed.error().message());
        co_await stop_.sleep(std::chrono::seconds(1));
        continue;
      }
      std::set<std::string> answered;
      for (const KeyValue& kv : listed->ranges[1].kvs) answered.insert(kv.key.substr(keys_.replies_root().size()));
      std::vector<KeyValue> pending;
      for (const KeyValue& kv : listed->ranges[0].kvs)
        if (!answered.count(kv.key.substr(keys_.requests_root().size()))) pending.push_back(kv);
      std::sort(pending.begin(), pending.end(), by_age);
      if (pending.size() > max_batch) pending.resize(max_batch);
      made_.erase(made_.begin(), std::upper_bound(made_.begin(), made_.end(), listed->revision));  // listed
      relist_ = false;
      const auto now = std::chrono::steady_clock::now();
      if (!pending.empty() && pending.size() < last_pass && (!gathering || now < *gathering)) {
        if (!gathering) gathering = now + gather_window;
        co_await wait_for_requests(listed->revision, last_pass - pending.size(), *gathering);
        continue;
      }
      gathering.reset();
      last_pass = pending.size();
      const bool any = !pending.empty();
      const std::vector<KeyValue> alone = co_await together(std::move(pending));
      for (const KeyValue& kv : alone) {
        if (!leading_) co_return;
        co_await handle(kv);
      }
      if (any) continue;  // more may have come meanwhile
      // Nothing waits: until a request comes (or a while, as a net for a lost watch).
      co_await wait_for_requests(listed->revision, 1, now + std::chrono::seconds(30));
    }
  }

  static bool by_age(const KeyValue& a, const KeyValue& b) { return a.create_revision < b.create_revision; }

  // Until `more` requests have been made after `revision`, the term ends, or `deadline` passes.
  awaitable<void> wait_for_requests(int64_t revision, size_t more, std::chrono::steady_clock::time_point deadline) {
    auto made_after = [&] {
      return size_t(made_.end() - std::upper_bound(made_.begin(), made_.end(), revision));
    };
    while (leading_ && !relist_ && made_after() < more && std::chrono::steady_clock::now() < deadline) {
      arrivals_.expires_at(deadline);
      error_code woken;
      co_await arrivals_.async_wait(asio::redirect_error(use_awaitable, woken));
    }
  }

  // The revisions at which requests are made, from one watch kept for the term, and a word to
  // the wait above at each: a watch made for each wait would start behind etcd's head, and etcd
  // catches such a watch up only every 100 ms.
  awaitable<void> count_requests() {
    const std::string root = keys_.requests_root(), end = prefix_range_end(root);
    int64_t since = term_ + 1;
    while (leading_) {
      auto watch = etcd_->watch(WatchOptions{root, end, since, false});
      watches_.insert(watch.get());
      while (leading_) {
        const WatchBatch batch = co_await watch->next();
        if (batch.compact_revision) since = batch.compact_revision;  // what is left to watch from
        if (batch.error.code || batch.canceled || batch.compact_revision) {
          // Requests made meanwhile may never be seen here: the waiting pass lists again.
          relist_ = true;
          arrivals_.cancel();
          break;
        }
        for (const WatchEvent& event : batch.events) {
          if (event.type == WatchEvent::Type::put && event.kv.version == 1) made_.push_back(event.kv.mod_revision);
          since = event.kv.mod_revision + 1;
        }
        arrivals_.cancel();
      }
      watches_.erase(watch.get());
      if (leading_) co_await stop_.sleep(std::chrono::seconds(1));  // etcd away: watched again
    }
  }

  // The schedule requests among `pending` that can go together (without a group: a group's
  // members are placed one request at a time) go as a batch when there are two or more; what
  // is left to take alone is returned, oldest first.
  awaitable<std::vector<KeyValue>> together(std::vector<KeyValue> pending) {
    std::vector<WaitingRequest> batch;
    std::vector<KeyValue> alone;
    for (const KeyValue& kv : pending) {
      auto waiting = co_await batchable(kv);
      if (waiting) {
        batch.push_back(std::move(*waiting));
      } else {
        alone.push_back(kv);
      }
    }
    if (batch.size() < 2) co_return pending;
    // Two batches at once, of different projects, whose steps (looks, holds, claims,
    // hand-overs) Placement's and etcd's workers take side by side. Two that claim the same
    // room meet in Placement, which overbooks nothing: the one refused is taken alone.
    std::vector<std::string> projects;
    for (const WaitingRequest& waiting : batch) projects.push_back(waiting.project);
    const std::vector<std::vector<size_t>> shares = split_by_project(projects, batches_in_flight);
    std::vector<std::vector<WaitingRequest>> lefts(shares.size());
    std::vector<awaitable<void>> batches;
    for (size_t i = 0; i < shares.size(); ++i) {
      std::vector<WaitingRequest> share;
      for (size_t index : shares[i]) share.push_back(std::move(batch[index]));
      batches.push_back(take_batch(std::move(share), lefts[i]));
    }
    co_await run_together(std::move(batches));
    for (std::vector<WaitingRequest>& left : lefts)
      for (WaitingRequest& waiting : left) alone.push_back(std::move(waiting.kv));
    std::sort(alone.begin(), alone.end(), by_age);
    co_return alone;
  }

  awaitable<void> take_batch(std::vector<WaitingRequest> share, std::vector<WaitingRequest>& left) {
    left = co_await schedule_together(io_, config_, etcd_, placement_, lease_, looks_ahead_, std::move(share));
  }

  awaitable<std::optional<WaitingRequest>> batchable(const KeyValue& kv) {
    auto waiting = waiting_request(kv);
    if (!waiting) co_return std::nullopt;
    auto request = decode_request(kv.value);
    if (!request || request->action != RequestAction::schedule || !request->group.empty()) co_return std::nullopt;
    if (!request->policy.empty() && !parse_weigh_kind(request->policy)) co_return std::nullopt;
    waiting->options = schedule_options(std::move(*request), waiting->project, waiting->id);
    // Asked before this leader led: another may have begun it. Taken alone if it left anything.
    if (kv.create_revision < term_) {
      auto left = co_await left_before(waiting->options.uuids, waiting->project);
      if (!left || *left) co_return std::nullopt;
    }
    co_return waiting;
  }

  // A member's console request (`project-console-requests/<project>/<instance>/<asker>`, under
  // its lease) passed on to the instance's host, under the same lease, for an instance of that
  // project only; the host's agent publishes the console where the project may read it.
  awaitable<void> relay_consoles() {
    const std::string root = keys_.project_console_requests_root(), end = prefix_range_end(root);
    while (leading_) {
      auto listing = co_await etcd_->range(root, end);
      if (!listing) {
        co_await stop_.sleep(std::chrono::seconds(1));
        continue;
      }
      for (const KeyValue& kv : listing->kvs) co_await pass_on(root, kv);
      auto watch = etcd_->watch(WatchOptions{root, end, listing->revision + 1, false});
      watches_.insert(watch.get());
      while (leading_) {
        WatchBatch batch = co_await watch->next();
        if (batch.error.code || batch.canceled || batch.compact_revision) break;  // listed again
        for (const WatchEvent& event : batch.events)
          if (event.type == WatchEvent::Type::put) co_await pass_on(root, event.kv);
      }
      watches_.erase(watch.get());
    }
  }

  awaitable<void> pass_on(std::string root, KeyValue kv) {
    const std::string rest = kv.key.substr(root.size());  // <project>/<instance>/<asker>
    const size_t first = rest.find('/'), second = first == std::string::npos ? first : rest.find('/', first + 1);
    if (second == std::string::npos || second + 1 == rest.size()) co_return;
    const std::string project = rest.substr(0, first), uuid = rest.substr(first + 1, second - first - 1),
                      asker = rest.substr(second + 1);
    if (!is_project_name(project) || !is_uuid(uuid)) co_return;
    auto target = co_await find_instance(*etcd_, keys_, uuid);
    if (!target || target->record.project != project) co_return;  // not the project's: nothing to show it
    auto put = co_await etcd_->put(keys_.console_request(target->record.host, uuid, asker), project, kv.lease);
    if (!put) spdlog::debug("scheduler: passing on {}: {}", kv.key, put.error().message());
  }

  // requests/<project>/<id>: the project is the key's, whatever the value says. Every write
  // of its answer requires the request still asked, not answered, and this service still the
  // leader it was when it read it.
  std::optional<WaitingRequest> waiting_request(const KeyValue& kv) const {
    const std::string rest = kv.key.substr(keys_.requests_root().size());
    const size_t slash = rest.find('/');
    WaitingRequest waiting;
    waiting.project = rest.substr(0, slash);
    waiting.id = slash == std::string::npos ? "" : rest.substr(slash + 1);
    if (!is_project_name(waiting.project) || !is_uuid(waiting.id)) return std::nullopt;
    waiting.kv = kv;
    waiting.reply_key = keys_.reply(waiting.project, waiting.id);
    waiting.standing = {EtcdCompare::present(kv.key), EtcdCompare::absent(waiting.reply_key),
                        EtcdCompare{keys_.scheduler_leader(), EtcdCompare::Target::create_revision,
                                    EtcdCompare::Result::equal, term_, {}}};
    return waiting;
  }

  awaitable<void> handle(const KeyValue& kv) {
    auto waiting = waiting_request(kv);
    if (!waiting) {
      spdlog::warn("scheduler: ignoring {}: not a request key", kv.key);
      co_return;
    }
    auto request = decode_request(kv.value);
    if (!request) {
      ProjectReply refused{2, {}, "the request cannot be read: " + request.error().message(), {}};
      co_await answer_request(*etcd_, waiting->standing, waiting->reply_key, kv.lease, refused);
      co_return;
    }
    spdlog::info("scheduler: {} of project {} asks to {}", request->user, waiting->project,
                 to_string(request->action));
    ProjectReply reply;
    if (request->action == RequestAction::schedule) {
      auto done = co_await schedule(*waiting, std::move(*request));
      if (!done) co_return;  // answered in its hand-over
      reply = std::move(*done);
    } else {
      reply = co_await power(waiting->project, *request);
    }
    co_await answer_request(*etcd_, waiting->standing, waiting->reply_key, kv.lease, reply);
  }

  // nullopt: answered by the hand-over itself.
  awaitable<std::optional<ProjectReply>> schedule(WaitingRequest waiting, ProjectRequest request) {
    const std::string& project = waiting.project;
    const KeyValue& kv = waiting.kv;
    ScheduleOptions options = schedule_options(std::move(request), project, waiting.id);
    if (!options.group.empty() && !parse_group_policy(options.group_policy))
      co_return ProjectReply{2, {}, fmt::format("bad group policy '{}'", options.group_policy), {}};
    if (!options.policy.empty() && !parse_weigh_kind(options.policy))
      co_return ProjectReply{2, {}, fmt::format("bad policy '{}'", options.policy), {}};
    // Asked before this leader led: another may have begun it.
    if (kv.create_revision < term_) {
      auto left = co_await left_before(options.uuids, project);
      if (!left) co_return ProjectReply{5, {}, left.error().message(), {}};
      if (*left) co_return std::move(**left);
    }
    RecordedSay said;
    OnBehalf on_behalf{std::move(waiting.standing), std::move(waiting.reply_key), kv.lease};
    Scheduler scheduler(io_, config_, options, said, etcd_, std::move(on_behalf));
    Outcome outcome = co_await scheduler.run();
    if (outcome && *outcome == ExitCode::ok) co_return std::nullopt;
    co_return reply_of(outcome, std::move(said.lines));
  }

  // What another leader left of the request: its instances (some handed over: answered from
  // their records), or claims it made and never handed over (given back: no hand-over of
  // theirs can happen any more, as it required that leader's key). nullopt: nothing is left.
  awaitable<result<std::optional<ProjectReply>>> left_before(std::vector<std::string> uuids, std::string project) {
    std::vector<EtcdOp> reads;
    for (const std::string& uuid : uuids) reads.push_back(EtcdOp::get(keys_.instance(uuid)));
    std::vector<EtcdCompare> always;
    auto read = co_await etcd_->txn(std::move(always), std::move(reads));
    if (!read) co_return read.error();
    ProjectReply found;
    for (const RangeResult& range : read->ranges) {
      if (range.kvs.empty()) continue;
      auto record = decode_instance(range.kvs.front().value);
      if (!record || record->project != project) continue;
      found.lines.push_back(fmt::format("NOTIFIED TARGET, {}, OF INSTANCE {}", record->host, record->uuid));
      found.instances.push_back(record->uuid);
    }
    if (!found.instances.empty()) co_return std::optional<ProjectReply>(std::move(found));
    for (const std::string& uuid : uuids) {
      auto held = co_await placement_.consumer_allocations(uuid);
      if (!held) co_return held.error();
      if (!held->generation || held->allocations.empty()) continue;
      spdlog::info("scheduler: giving back claim {} that an earlier leader left", uuid);
      Allocations none;
      if (auto released = co_await placement_.replace(uuid, std::move(none), *held->generation, held->owner); !released)
        co_return released.error();
    }
    co_return std::optional<ProjectReply>();
  }

  // stop, start, destroy: asked of the instance's host as `toyvm stop` asks it, for an
  // instance of the project only (any other is unknown to it, not forbidden).
  awaitable<ProjectReply> power(std::string project, ProjectRequest request) {
    const std::string uuid = request.instance;
    auto unknown = ProjectReply{3, {}, fmt::format("unknown instance {}", uuid), {}};
    if (!is_uuid(uuid)) co_return ProjectReply{2, {}, fmt::format("'{}' is not an instance uuid", uuid), {}};
    auto target = co_await find_instance(*etcd_, keys_, uuid);
    if (!target && target.error() == errc::not_found) co_return unknown;
    if (!target) co_return ProjectReply{5, {}, target.error().message(), {}};
    if (target->record.project != project) co_return unknown;
    const PowerState to = request.action == RequestAction::destroy ? PowerState::deleted
                          : request.action == RequestAction::stop  ? PowerState::stopped
                                                                   : PowerState::running;
    if (to != PowerState::deleted && target->record.state == InstanceState::error)
      co_return ProjectReply{5, {}, fmt::format("instance {} is in ERROR ({}); destroy it", uuid,
                                                target->record.error_code), {}};
    auto asked = co_await request_power(*etcd_, keys_, target->record, to);
    if (!asked) co_return ProjectReply{int(exit_code_for(asked.error().code)), {}, asked.error().message(), {}};
    co_return ProjectReply{0, {}, {}, {uuid}};
  }

  asio::io_context& io_;
  const Config& config_;
  std::string name_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  PlacementClient placement_;
  StopSignal stop_;
  int64_t term_ = 0;   // the revision at which this leader's key was made
  int64_t lease_ = 0;  // its lease, while it leads
  bool leading_ = false;
  std::set<EtcdWatch*> watches_;  // the term's waits, ended with it
  std::vector<int64_t> made_;     // revisions of requests made since the last pass's list
  bool relist_ = false;           // the watch behind made_ broke: what it missed is only in a list
  LooksAhead looks_ahead_;
  asio::steady_timer arrivals_{io_};  // the wait for requests, woken at each
};

std::string default_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return fmt::format("{}:{}", host, getpid());
}

}  // namespace

Outcome run_scheduler_service(const Config& base, const SchedulerServiceOptions& options) {
  Config config = base;
  config.etcd.keepalive = true;
  const std::string name = options.name.empty() ? default_name() : options.name;
  asio::io_context io(1);
  SchedulerService service(io, config, name);
  Outcome outcome = run_until_done(io, service.run());
  return service.stopped() ? Outcome(ExitCode::ok) : outcome;
}

}  // namespace toyvm
