#pragma once
// What a compute host knows of one instance, as one value, and the two pure functions over
// it: how a piece of news changes it (absorb) and which step the instance takes next
// (next_step). The agent's Instance holds one such value, changes it only by absorbing the
// news in its mailbox one at a time between steps, and asks model/reconcile's decide() and
// decide_move() the rest; every case here is unit-tested without I/O.

#include "model/moves.hpp"
#include "model/reconcile.hpp"
#include "model/records.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>

namespace toyvm {

// The news an instance hears, each from one source.
namespace news {
// Its work key was put at `revision`, with `value` as etcd has it (read when absorbed: it may
// be a newer writer's, or damaged). From a listing, `domain` is its domain as libvirt listed it
// then (empty: libvirt did not say).
struct WorkPut {
  int64_t revision = 0;
  std::string value;
  std::optional<DomainState> domain;
};
// Its work key was deleted at `revision`, or a listing at `revision` no longer holds it.
struct WorkGone {
  int64_t revision = 0;
};
// A move of it that names this host was put; `move` is empty when the value cannot be read.
struct MovePut {
  int64_t revision = 0;
  std::optional<MoveRecord> move;
};
// Its move record was deleted, or a listing at `revision` no longer holds it.
struct MoveGone {
  int64_t revision = 0;
};
// libvirt says its domain started, stopped or crashed, or a domain without work exists.
struct DomainChanged {
  bool started = false;
};
// libvirt knows the guest's address (the one on its own NIC when it has several).
struct AddressFound {
  std::string ip;
};
// address_timeout passed without an address.
struct AddressOverdue {};
}  // namespace news

using News = std::variant<news::WorkPut, news::WorkGone, news::MovePut, news::MoveGone, news::DomainChanged,
                          news::AddressFound, news::AddressOverdue>;

struct InstanceKnowledge {
  std::string uuid;
  // Its work as etcd has it (empty: the key is gone), and the revision of that; older news is stale.
  std::optional<WorkSpec> work;
  int64_t work_revision = 0;
  // Its work value cannot be decoded: it is there, so it is no reason to remove anything;
  // nothing is done for the instance until it can be read. `work_error` says why.
  bool work_unreadable = false;
  std::string work_error;
  std::optional<Phase> phase;              // empty: what this host recorded is not read back yet
  std::optional<InstanceRecord> failure;  // the ERROR record as last written or read
  bool allocation_elsewhere = false;       // a move that did not happen left it on another host
  struct Address {
    std::string ip;  // once libvirt knows it
    std::chrono::steady_clock::time_point deadline{};  // looked for until then
    bool given_up = false;                             // the deadline passed
    bool unrecorded = false;                           // the ip or given_up is not in its record yet
  } address;
  // A move of it in flight, as last read; its revision guards every write of the move.
  std::optional<MoveRecord> move;
  int64_t move_revision = 0;
  bool move_unreadable = false;  // its move record cannot be read: nothing is decided for it
  bool recheck_work = false;     // a move ended: the work is read again before anything is decided
  bool prepared_here = false;    // a move here ended unseen: what was prepared for it goes unless its work came

  Phase recorded() const { return phase.value_or(Phase::unrecorded); }
  // Destroy requested (or the work gone).
  bool cancelled() const { return !work || work->power == PowerState::deleted; }
  bool moving() const { return move || move_unreadable; }
  // Nothing left to do or to keep: the instance may be forgotten.
  bool forgettable() const { return !work && !work_unreadable && !moving(); }
};

// What absorbing one piece of news did.
enum class Absorbed {
  stale,            // older than what is known, or nothing new: no step for it
  changed,          // a step is due
  work_unreadable,  // its work cannot be read: it is left as it is
  move_unreadable,  // its move cannot be read: it is left as it is
  address_found,    // a step is due, to record it
  address_overdue,  // a step is due, to record that none came
};
constexpr bool step_due(Absorbed absorbed) {
  return absorbed != Absorbed::stale && absorbed != Absorbed::work_unreadable &&
         absorbed != Absorbed::move_unreadable;
}

// `host`: this host's provider.
Absorbed absorb(InstanceKnowledge& known, const News& news, const std::string& host);

// Nothing to do for an instance whose domain is `domain`: its next step would decide nothing.
bool settled_with(const InstanceKnowledge& known, DomainState domain);

// Whether `news`, not absorbed yet, ends the instance's work (a destroy, or the work gone): a
// build under way stops at its next stage.
bool ends_work(const InstanceKnowledge& known, const News& news);
// Why `news`, not absorbed yet, ends a live send under way (a stop or destroy, an operator's
// abort); nothing when it does not. (Work that left this host went with the guest.)
std::optional<std::string_view> ends_send(const InstanceKnowledge& known, const News& news);

enum class InstanceStep {
  wait,             // something cannot be read: nothing is decided until it can
  recheck_work,     // a move ended: its work is read again
  remove_prepared,  // what was prepared here for a move that ended unseen goes, unless work came
  move,             // the next step of its move (decide_move)
  load_record,      // what this host recorded before it restarted is read back
  reconcile,        // decide() against its domain
};
std::string_view to_string(InstanceStep step) noexcept;

InstanceStep next_step(const InstanceKnowledge& known);

}  // namespace toyvm
