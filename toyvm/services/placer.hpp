#pragma once
// Where an instance goes, for `toyvm schedule` (new instances), for the compute agent (a
// failed build moving to another host), for `toyvm evacuate` and for the moves of `toyvm
// migrate`, `resize` and `host drain`, so they cannot drift apart:
// Placement's candidates for the instance's query, narrowed to live toyvm hosts and to what
// its server group allows, weighed, claimed first-fit (or moved), then handed over to the
// chosen host in etcd.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "core/config.hpp"
#include "model/groups.hpp"
#include "model/keys.hpp"
#include "model/moves.hpp"
#include "model/records.hpp"

#include <chrono>
#include <functional>

#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace toyvm {

struct PlacementView {
  Candidates candidates;
  std::set<std::string> live;                // providers whose host record says READY
  std::map<std::string, int> group_members;  // host -> members of the group on it
  std::set<GroupPolicy> group_policies;      // the policies the group's members were made with
};

struct Claim {
  std::string host;
  Allocations allocations;
};

// An instance as it is handed to a host: its work and its record (whose `host` names it).
struct Placed {
  WorkSpec work;
  InstanceRecord record;
};

struct HandOverResult {
  enum class Outcome { committed, refused, unknown };
  Outcome outcome = Outcome::unknown;
  int64_t revision = 0;  // committed: the revision of the write
  Error error;           // unknown: why etcd did not tell
};

// An instance to move off `from`: a failed build or an evacuation (Placer::relocate: its work
// goes to the chosen host at once, its allocation whole), or a guest that moves while its source
// keeps a share (Placer::claim_move, for `toyvm migrate`, `resize`, `host drain`: its move
// record names the chosen host, the migration consumer holds `from`'s share, and the two hosts'
// agents move the guest).
struct Relocation {
  WorkSpec work;               // as its new host gets it (a resize's new size): its query and group
                               // choose where, its resources become the chosen host's
  std::string from;            // the provider it leaves
  std::string to;              // the one provider it may go to; empty: the best
  bool may_stay = false;       // `from` is a candidate too (a resize on its own host)
  int64_t work_revision = 0;   // of its work on `from`, as read when deciding: the hand-over requires it
  std::vector<EtcdCompare> also_require;  // more the hand-over requires (a dead host staying dead, the move as read)
  std::chrono::steady_clock::time_point deadline;  // for an etcd that does not answer the hand-over
};

struct Relocated {
  enum class Outcome {
    moved,      // its allocation and its work (or its move record) are on `host`
    no_room,    // no other live host fits it: it holds what it held
    lost_race,  // its allocation or its work changed since they were read (a stop, a destroy,
                // another move): nothing of ours is left written
    put_back,   // etcd refused the hand-over, and its allocation is back on `from`
    stranded,   // etcd refused (or did not tell), and its allocation could not be put back
                // from `host`, where it stays (`toyvm audit`: allocation_elsewhere; a move
                // record left preparing is undone by the source's agent)
  };
  Outcome outcome = Outcome::no_room;
  std::string host;
  int64_t revision = 0;  // moved: of the hand-over's write
  Error unknown;  // set when etcd did not tell whether it took the hand-over
};

// Where a look asks, narrowest first, widened each time it found no room: a few hosts at
// random, then a shard ([placement] shards) and up to two others, all at random, then the
// whole cloud, so "no room" still means no room anywhere. (A batch fills its shard by a large
// share, so shards fill unevenly; at 100,000 instances the whole cloud's look cost four
// shards', and batches there all meet on their hosts in Placement.)
class LookScope {
 public:
  // `sample`: hosts asked about at random first (0: none); `shards`: the cloud's (1: none).
  LookScope(int sample, int shards);
  int sample() const { return sample_; }               // > 0: this many hosts at random
  const std::string& shard() const { return shard_; }  // else this shard; empty: the whole cloud
  // To the next wider place after no room; false: it was the whole cloud.
  bool widen();
  std::string describe() const;

 private:
  static constexpr int shard_tries = 3;
  std::string another_shard();  // one not asked about yet, while there are any
  int sample_ = 0, shards_ = 1;
  std::string shard_;
  std::set<std::string> asked_;
  std::mt19937_64 rng_;
};

class Placer {
 public:
  Placer(Placement& placement, EtcdClient& etcd, const Config& config)
      : placement_(placement), etcd_(etcd), keys_(config.etcd.prefix), config_(config) {}

  // Candidates, live hosts and the group's members, asked of Placement and etcd at once.
  // Disabled providers are left out. `group` may be empty; `moving` (an instance uuid) does
  // not count as a member. Errors are Placement's or etcd's codes.
  // `limit` (when > 0) replaces candidate_limit unless the query has its own; `timeout` (when
  // not zero) replaces [placement] timeout for Placement's answer.
  awaitable<result<PlacementView>> look(PlacementQuery query, std::string group, std::string moving = {},
                                        int limit = 0, Duration timeout = {});

  // A look at a few live hosts instead of the cloud: up to `hosts` READY host records read from
  // etcd from the point `from` (a random uuid) on among the host keys, which are the providers'
  // random uuids, so a random sample; and Placement asked about each of them alone, side by
  // side: its usage, beside the capacity its record names, or for a query with traits its
  // search (in_tree). For a large cloud: Placement's search reads every provider's usage of
  // each resource class asked for, whatever member_of narrows it to afterwards, while in_tree
  // narrows the search itself. The sample's providers are toyvm's (their agents put those
  // records), so the provider trait is not asked for. The claim is Placement's own check of
  // room, so a capacity the record has wrong costs a try, never an overbooking. No candidates:
  // no room among them, not in the cloud. Only for a query samplable() accepts, and no group.
  awaitable<result<PlacementView>> sample(PlacementQuery query, int hosts, std::string from);
  // One request group that names no place: every group would need its own in_tree, and a
  // sample would seldom hold a zone's or an aggregate's hosts.
  static bool samplable(const PlacementQuery& query);

  // The ways to place one instance, best first, within the group's policy. Pure: it needs
  // no Placer, so a batch can be planned without one.
  static std::vector<Choice> rank(const PlacementView& view, const WeighPolicy& policy, double random,
                                  std::optional<GroupPolicy> group);

  // Tries the choices in order: a generation conflict retries the same one, a capacity
  // conflict moves on to the next; no_allocations_left when none fits. The consumer is `owner`'s.
  awaitable<result<Claim>> claim_first_fit(std::string uuid, std::vector<Choice> choices, ConsumerOwner owner);

  // The consumer's allocations replaced by `to` in one step, only while they are still what
  // the caller read and decided on (`read`, whose consumer generation guards the write):
  // moved; no_room where `to` asks; changed: another move or a release got there first (or
  // the consumer holds nothing), and nothing was written.
  enum class Move { moved, no_room, changed };
  awaitable<result<Move>> move_allocation(std::string uuid, ConsumerAllocations read, Allocations to);

  // Hands instances over in one transaction under `guard`: their work keys, records and
  // group memberships are written along with `also`. refused: etcd said the guard did not
  // hold. A transaction that failed with an error may have committed anyway: it is read back
  // by its own write (the first work key holding exactly the value written here, not merely
  // another's change), and one that did not commit is made again until etcd answers or
  // `deadline` passes (then the outcome is unknown).
  // `read_back` replaces that reading where the first work key may have existed before (a
  // resize on its own host rewrites it): a key that tells this write from any other.
  struct ReadBack {
    std::string key;
    // The revision to report when what `key` holds is this write's (or a later one that
    // follows from it), nothing otherwise.
    std::function<std::optional<int64_t>(const KeyValue&)> ours;
  };
  awaitable<HandOverResult> hand_over(std::vector<Placed> placed, std::vector<EtcdCompare> guard,
                                      std::vector<EtcdOp> also, std::chrono::steady_clock::time_point deadline,
                                      std::optional<ReadBack> read_back = std::nullopt);

  // The two ways off `from`, one protocol each, over the same candidates: those of the
  // instance's own query and group (its source left out unless it may stay, only `to` when
  // named), tried best first under the consumer generation read first; every hand-over is
  // guarded by `work_revision`, `also_require` and the chosen host not being disabled.
  // Errors: Placement or etcd did not answer before anything was written.
  //
  // relocate: its allocation moved whole, then its work and `record` (`host` becomes the chosen
  // host) written there and its work on `from` erased; when etcd refuses, the allocation goes
  // back to `from`, and only from where this put it, while the work is still there.
  awaitable<result<Relocated>> relocate(Relocation move, InstanceRecord record);
  // claim_move: the books begun as Nova's (begin_move), then `record` written claimed with the
  // chosen host as its destination; when etcd refuses, the books are swapped back.
  awaitable<result<Relocated>> claim_move(Relocation move, MoveRecord record);

  // After a move that did not happen, the allocation goes back to `from` while the work is
  // still there: only from `put` (where the move put it), or from wherever it is when `put`
  // is empty. put_back (or nothing was held), lost_race (the work left `from`: whoever took
  // it answers for its allocation), stranded (it could not, or Placement or etcd did not say).
  awaitable<Relocated::Outcome> put_back(std::string uuid, std::string from, ResourceAmounts resources,
                                         std::optional<Allocations> put);

  // The books of a guest that moves while its source keeps a share (Nova's protocol, made one
  // request): the instance's allocations become `to` (the destination's, or for a resize on
  // its own host its new size) and its migration consumer takes over what it held, both
  // under what was read (`held`, the instance's). moved; no_room where `to` asks; changed:
  // the instance's allocations moved since they were read, and nothing was written.
  awaitable<result<Move>> begin_move(std::string uuid, std::string migration, ConsumerAllocations held, Allocations to);
  // The move happened: the migration consumer's share goes (guarded by its generation).
  // Done when it holds nothing, as after an earlier try.
  awaitable<result<void>> finish_move(std::string migration);
  // The move did not happen: the instance takes back what its migration consumer holds, which
  // drops its claim on the destination, in one request. moved; changed: the migration
  // consumer holds nothing (finished, or reverted before), and nothing was written.
  awaitable<result<Move>> revert_move(std::string uuid, std::string migration);

  // The weighers as configured, `policy_name` ("spread"/"pack") overriding the config's.
  WeighPolicy weigh_policy(const std::string& policy_name = {}) const;

  Placement& placement() { return placement_; }
  const Config& config() const { return config_; }

 private:
  // Where a relocation may go, best first, and what the instance held when that was read
  // (lost_race: nothing on `from` any more).
  struct Homes {
    ConsumerAllocations held;
    PlacementView view;  // its source left out unless it may stay
    bool lost_race = false;
    // Best first; they point into `view`.
    std::vector<Choice> choices(const Relocation& move, const WeighPolicy& policy) const;
  };
  awaitable<result<Homes>> homes(const Relocation& move, const LookScope& scope);
  // relocate and claim_move within one scope; no_room: none there.
  awaitable<result<Relocated>> relocate_within(const Relocation& move, InstanceRecord record, const LookScope& scope);
  awaitable<result<Relocated>> claim_move_within(const Relocation& move, const MoveRecord& record,
                                                 const LookScope& scope);
  // A relocation asks a shard first, as a schedule does; one to a named host asks only it.
  LookScope relocation_scope(const Relocation& move) const;
  awaitable<void> ask_candidates(std::string query, result<Candidates>& answer);
  // The host's room for `asked`, as its usage and its record's capacity tell it.
  awaitable<void> ask_room(const HostRecord& host, const ResourceAmounts& asked, result<Candidates>& answer);
  std::vector<EtcdCompare> relocation_guard(const Relocation& move, const std::string& host) const;

  // What hand_over says of `writes` under `guard`, the transaction's outcome told by reading
  // `probe` back when etcd does not answer.
  awaitable<HandOverResult> commit(std::vector<EtcdCompare> guard, std::vector<EtcdOp> writes, ReadBack probe,
                                   std::chrono::steady_clock::time_point deadline);

  Placement& placement_;
  EtcdClient& etcd_;
  KeyLayout keys_;
  const Config& config_;
};

}  // namespace toyvm
