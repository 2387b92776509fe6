#pragma once
// `toyvm audit`: Placement's allocations, etcd's records and the domains each agent reports
// must describe the same instances. Given one snapshot of all three, lists every way they
// disagree. Pure.

#include "model/candidates.hpp"
#include "model/moves.hpp"
#include "model/records.hpp"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace toyvm {

// A value in etcd that cannot be decoded: a newer writer's, or a damaged one. Nothing acts on
// it as if it were gone.
struct UnreadableValue {
  std::string instance;
  std::string key;
  std::string why;

  bool operator==(const UnreadableValue&) const = default;
};

// A claim whose hold lapsed, as read: the claim's revision, and the schedule's hold it names
// (by its first instance; its revision, 0 when it was gone) or none (the claim held its own
// deadline).
struct LapsedHold {
  int64_t claim_revision = 0;
  std::optional<std::string> hold;
  int64_t hold_revision = 0;

  bool operator==(const LapsedHold&) const = default;
};

struct AuditSnapshot {
  std::set<std::string> providers;                           // in Placement
  std::map<std::string, Allocations> allocations;            // consumer -> provider -> amounts
  std::set<std::string> live_hosts;                          // providers with a host record
  std::map<std::string, std::string> work_host;              // instance -> provider its work key is under
  std::map<std::string, InstanceRecord> instances;           // instance -> record
  std::map<std::string, std::string> group_members;          // instance -> group it is a member of
  std::map<std::string, std::set<std::string>> domains;      // live provider -> domain uuids it reports
  std::vector<UnreadableValue> unreadable;                   // work and records that do not decode
  std::set<std::string> claiming;                            // instances a running schedule claims for
  std::map<std::string, LapsedHold> lapsed_holds;            // instance -> its claim's lapsed hold, as read
  std::map<std::string, int64_t> lapsed_schedule_holds;      // a schedule's hold key past its deadline -> its revision
  std::map<std::string, MoveRecord> moves;                   // instance -> its move in flight
  bool moves_unreadable = false;  // a move record does not decode: any consumer may be its migration
  int64_t now_ms = 0;             // when the snapshot was taken (unix milliseconds)
  int64_t move_deadline_ms = 0;   // a move started longer ago than this is overdue; 0: never
  // Consumers read one by one (those that hold resources and are no instance, and ERROR
  // instances that hold some): whose they are, and the generation a fix is guarded by. Only
  // The consumers of `own_project` (the consumer_project) and of its projects are toyvm's to
  // judge (Nova's, or another toyvm's, share the Placement).
  std::string own_project = "toyvm";
  std::map<std::string, ConsumerAllocations> consumers;
};

enum class AuditKind {
  allocation_without_instance,  // a consumer of toyvm's holds resources, no instance exists
  instance_without_allocation,  // an instance that should hold resources holds none
  allocation_elsewhere,         // held on another provider than the work's host
  work_on_unknown_provider,     // work for a provider Placement does not know
  work_on_dead_host,            // work for a provider whose agent is not alive
  error_holding_allocation,     // an ERROR instance (given back, it says) still holds resources
  domain_without_work,          // a domain its host has no work for
  member_without_instance,      // a server group member whose instance is gone
  record_without_work,          // an instance record with no work anywhere
  instance_without_domain,      // ACTIVE or STOPPED on a live host that reports no domain for it
  unreadable_value,             // work or a record toyvm cannot decode; agents leave it alone
  move_overdue,                 // a move in flight for longer than its deadline
  move_without_domain,          // ACTIVE or STOPPED and moving, yet neither live host reports its domain
  hold_lapsed,                  // a claim's key whose hold lapsed (the schedule gone), nothing claimed under it
  schedule_hold_lapsed,         // a schedule's hold key past its deadline (named by its first instance)
};

std::string_view to_string(AuditKind kind) noexcept;

struct Discrepancy {
  AuditKind kind;
  std::string instance;
  std::string provider;  // where it was seen, when there is one
  std::string detail;

  bool operator==(const Discrepancy&) const = default;
};

// A key as read: its value and its mod revision.
struct KeyRead {
  std::string value;
  int64_t revision = 0;
};

// Sorts the claims (instance -> its `claims/` key) and the schedules' holds (first instance
// -> its `holds/` key), read together at `s.now_ms`, into `s.claiming`, `s.lapsed_holds` and
// `s.lapsed_schedule_holds`. A claim naming a hold that is gone is its schedule's no more
// (the schedule let go of it, or an audit took it); a deadline that cannot be read stands.
void sort_holds(AuditSnapshot& s, const std::map<std::string, KeyRead>& claims,
                const std::map<std::string, KeyRead>& holds);

std::vector<Discrepancy> find_discrepancies(const AuditSnapshot& snapshot);

// What `--fix` may repair without guessing, provided it was seen in two snapshots a grace
// period apart: allocations with no instance and no schedule claiming for it (released),
// resources an ERROR instance still holds (released), members of a gone instance (deleted).
// Releases are guarded by the consumer generation of the second snapshot.
bool fixable(AuditKind kind) noexcept;

}  // namespace toyvm
