#pragma once
// The one `toyvm schedule` run, shared by its two halves: services/schedule.cpp claims the
// resources in Placement (under a hold in etcd), services/schedule_hand_over.cpp hands the
// claimed instances to their hosts through etcd and waits for them to settle.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "core/async.hpp"
#include "core/config.hpp"
#include "model/groups.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "services/common.hpp"
#include "services/placer.hpp"
#include "services/member.hpp"
#include "services/quota.hpp"
#include "services/services.hpp"

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace toyvm {

// A schedule made for a project's member by the scheduler service: its hand-over also
// writes the service's reply, and requires what the service stands on (the request still
// there, no reply yet, the service still the leader), so a request is answered once.
struct OnBehalf {
  std::vector<EtcdCompare> require;
  std::string reply_key;
  int64_t reply_lease = 0;  // the request's: a reply nobody waits for goes with it
};

class Scheduler {
 public:
  Scheduler(asio::io_context& io, const Config& config, const ScheduleOptions& options, Say& say,
            std::shared_ptr<EtcdClient> etcd = nullptr, std::optional<OnBehalf> on_behalf = std::nullopt);

  awaitable<Outcome> run();

  // What a schedule asks, read and checked before anything is claimed.
  struct Prepared {
    PlacementQuery query;             // with its zone's aggregate
    WorkSpec spec;                    // the guest data
    std::vector<std::string> uuids;   // its instances
    ProjectStanding project;
    ProjectUsage asked;               // what it counts against the project's quota
    ConsumerOwner owner;              // its consumers' in Placement
  };
  // The two halves of run() for the scheduler service's batches (services/scheduler_batch.cpp),
  // which claims for many schedules at once: everything before the claim (the project read,
  // unless the batch read it once for all its requests: `project`; the request's quota
  // checked alone)...
  awaitable<result<Prepared>> prepare(std::optional<result<ProjectStanding>> project = std::nullopt);
  // ... and everything after it, given claims made under the service's hold: the hand-over
  // with its reply, or the instances given up. nullopt: a host was disabled since the look;
  // the claims are given back and the request is to be placed again.
  awaitable<std::optional<Outcome>> hand_over_claimed(const Prepared& prepared, std::vector<Claim> claims);

 private:
  // How long a schedule's hold on its claims outlives it (killed, or cut off from etcd), give
  // or take the hosts' clocks (hold_clock_margin_ms).
  static constexpr int64_t claim_hold_ttl_s = 10;
  // How long a member's schedule waits for the scheduler service to answer.
  static constexpr Duration service_timeout = std::chrono::seconds(60);

  // What a hand-over did: the revision of its last write, or how far it got.
  struct HandOver {
    int64_t revision = 0;
    size_t handed = 0;     // the first `handed` instances are in etcd
    size_t in_doubt = 0;   // the next ones may be: etcd did not say
    bool hold_lapsed = false;
    std::string disabled_host;  // refused: this host was disabled since the look
    Error error;
  };

  // The command line's request, checked as it is (no one asked yet).
  result<Prepared> read_request() const;
  // The request within its project's quota, and what it asks counted. Without `project`, the
  // project is read with the hold and its quota checked after the first look (first_look).
  awaitable<result<Prepared>> admit(Prepared asked, std::optional<result<ProjectStanding>> project);
  std::string project_name() const {
    return options_.project.empty() ? config_.schedule.project : options_.project;
  }
  awaitable<Outcome> place(PlacementQuery query, WorkSpec spec, std::vector<std::string> uuids);
  // Each instance's work and record on its claimed host, handed over.
  awaitable<HandOver> hand_over_claims(const WorkSpec& spec, const std::vector<std::string>& uuids,
                                       const std::vector<Claim>& claims, std::vector<WorkSpec>& specs,
                                       std::vector<InstanceRecord>& records);
  // After the hand-over: what was handed said, or what was not taken back; the wait, if asked.
  awaitable<Outcome> settle(HandOver handed, std::vector<std::string> uuids, std::vector<WorkSpec> specs,
                            std::vector<InstanceRecord> records);
  // A project member's schedule: asked of the scheduler service, which claims for it.
  awaitable<Outcome> ask_service(WorkSpec spec);

  // Before anything is claimed: the schedule's hold (one key, the deadline it stands until; no
  // lease to grant, keep and let run out) and a key per instance naming it, in groups within
  // etcd's limits, the hold with the first (so a single schedule's is one write).
  awaitable<result<void>> hold_claims();
  // Moves the deadline on while the schedule runs; never ends by itself.
  awaitable<void> keep_holding();
  // The hold's deadline moved on, one write however many instances, only while it is as this
  // schedule last wrote it: a hold that lapsed (erased by `audit --fix`) or was handed over is
  // not put again.
  awaitable<void> renew_hold();
  // The claims' keys erased where still as written, and the hold: the schedule gives up.
  awaitable<void> let_go();
  std::string hold_key() const { return keys_.hold(uuids_.front()); }

  // The first look and the hold (with the project's record, when not read yet) go out
  // together: neither waits for the other.
  awaitable<result<PlacementView>> first_look(PlacementQuery query, int limit);
  // Candidates, live hosts and the group's members, with the group's policy checked, within
  // the scope.
  awaitable<result<PlacementView>> look(PlacementQuery query, int limit);
  std::optional<GroupPolicy> group_policy() const { return group_policy_; }

  // One instance: the weighed candidates tried in turn (the sample's, the shard's, then the cloud's).
  awaitable<result<std::vector<Claim>>> claim_one(PlacementQuery query, std::string uuid);
  // A batch: planned against the free capacity Placement shows, then claimed in one request
  // (all or nothing). When the plan does not fit in the candidates shown, more are asked
  // for; when another claim got in first, Placement is asked again and the batch re-planned.
  // Of batches that compete, the first to reach Placement wins: none undoes another's work.
  awaitable<result<std::vector<Claim>>> claim_batch(PlacementQuery query, const std::vector<std::string>& uuids);
  awaitable<void> release_all(const std::vector<std::string>& uuids);

  // The `index`th instance of this schedule, as it is handed over: its work (the command
  // line's guest data in `guest`) and its first record.
  Placed instance(const WorkSpec& guest, std::string uuid, int index, std::string host, ResourceAmounts resources) const;

  // Create-only transactions, as many instances each as etcd's limits on operations and
  // request size allow, each read back when etcd did not say whether it committed.
  awaitable<HandOver> hand_over(const std::vector<WorkSpec>& specs, const std::vector<InstanceRecord>& records);
  // A batch is all or nothing: what was handed over is taken back while no agent has touched
  // it, and claims are released only for instances known not to be in etcd. An instance whose
  // fate etcd did not tell keeps its claim (`toyvm audit --fix` resolves it either way).
  awaitable<Outcome> give_up_hand_over(HandOver handed, std::vector<std::string> uuids, std::vector<WorkSpec> specs,
                                   std::vector<InstanceRecord> records);
  // Says each state the instance reaches until it is settled; rides over a lost watch. An
  // ACTIVE guest without an address is errc::no_address.
  awaitable<result<void>> wait_until_settled(const std::string& uuid, int64_t since_revision);

  asio::io_context& io_;
  const Config& config_;
  const ScheduleOptions& options_;
  Say& say_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  PlacementClient placement_;
  Placer placer_;
  std::vector<std::string> uuids_;  // the instances of this schedule
  bool held_ = false;               // its claims are held (hold_claims) and not handed over or let go
  std::vector<size_t> hold_ends_;       // where each group of the claims' keys ends in uuids_
  std::vector<int64_t> hold_revisions_; // the revision each group was written at; 0: erased
  int64_t hold_revision_ = 0;           // the hold's, as last written; 0: lapsed or let go
  std::optional<GroupPolicy> group_policy_;  // with a group
  bool claiming_ = false;    // a claim went to Placement
  std::optional<OnBehalf> on_behalf_;
  std::optional<ProjectMembership> member_;  // the caller's project, when it is a member's
  ProjectStanding project_;  // the instances' project, as read before claiming
  bool project_unread_ = false;  // to be read with the hold (admit), its quota checked then
  ConsumerOwner owner_;      // their consumers' in Placement
  ProjectUsage asked_;       // what they count against its quota
  LookScope scope_{0, 1};  // what is asked about, widened each time it had no room
};

}  // namespace toyvm
