#pragma once
// A guest moving between hosts (`toyvm migrate`, `resize`, `host drain`), as etcd keeps it at
// <prefix>/moves/<instance> from before its books change until they are settled. Both agents,
// `show` and `audit` see a move in flight by it, and whoever finds one after a crash knows
// where the resources are: the books follow Nova's protocol (a migration consumer of its own
// uuid holds the source's share while the instance claims the destination).
//
// The protocol, state by state: who moves it on, and what ends it when that one is gone.
// decide_move is its one decision table (the agents', and `evacuate` standing in for a dead
// source through dead_source_view); Placer::claim_move makes the books and the claim.
//   preparing    asker (Placer::claim_move)  source reverts it after move_prepare_timeout
//   claimed      destination (prepare)       source reverts after move_prepare_timeout, or
//                                            once the destination has had no agent for a lease
//   ready        source (migrate / copy)     live: live_migration_completion_timeout, then
//                                            aborted; a dead destination: reverted
//   left_source  destination (switch_over)   a destination dead for a lease: the source hands
//                                            the work to it, and evacuating it rebuilds it
//   copied       destination (switch_over)   a dead destination: the source reverts
//   switched     source (settle)             a dead source: the destination settles
//   reverting    source (unwind), destination (clean_up) first
// Anything older than audit's --move-deadline is an audit finding (move_overdue).

#include "core/error.hpp"
#include "model/domain.hpp"
#include "model/records.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace toyvm {

enum class MoveKind { live, cold, resize };

enum class MoveState {
  preparing,  // written by its asker, who then moves the books (Placer::relocate); no destination yet
  claimed,    // the migration consumer holds the source, the instance the destination (named now)
  ready,      // the destination made the guest's files and says how to reach it: the source moves it
  left_source,  // the source no longer has the guest: the destination says whether it runs there
  switched,   // the guest runs on the destination: the migration consumer's share is to go
  reverting,  // the guest stays on the source: the books are to be swapped back
  copied,     // cold: the source's guest is off and its disk is on the destination, which defines
              // it there and switches over
};

struct MoveRecord {
  std::string instance;
  std::string migration;    // the migration consumer's uuid in Placement
  std::string source;       // providers
  std::string destination;  // empty while preparing
  MoveKind kind = MoveKind::live;
  MoveState state = MoveState::preparing;
  int64_t started_at = 0;   // unix milliseconds
  // ready: where the source's libvirt sends the guest, and the domain as the destination has it;
  // for a cold move also the disk (the destination's volume) the source's disk is copied into.
  std::string libvirt_uri{};
  std::string migration_uri{};
  std::string domain_xml{};
  std::string disk{};
  std::string query{};      // resize: the instance's placement query from now on
  std::string error{};      // reverting: why the move did not happen
  bool abort = false;       // an operator asked it undone (`toyvm migrate --abort`)

  bool operator==(const MoveRecord&) const = default;
};

std::string_view to_string(MoveKind kind) noexcept;
std::string_view to_string(MoveState state) noexcept;

// What one agent does next about a move of an instance it is the source or the destination of.
// Pure: every case is unit-tested.
enum class MoveAction {
  none,         // someone else's turn
  prepare,      // destination: the guest's files made here, then ready with how to reach it
  migrate,      // source: the guest sent to the destination while it runs
  left,         // source: the guest is not here (any more): left_source, for the destination to answer
  switch_over,  // either: the guest runs on the destination: its work and record go there
  settle,       // source (destination, once the source died): the migration consumer's share given
                // back, the record deleted
  revert,       // the move does not happen: reverting (saying why)
  unwind,       // source: the books swapped back (Placer::revert_move), the record deleted
  clean_up,     // destination: what prepare made here removed, then (live) unwind as the source
                // would; a cold move's source unwinds it, and starts the guest it powered off
  copy,         // source, cold: the guest powered off here and its disk copied there, then copied
  resize_here,  // a resize on its own host: the guest powered off and made its new size, then
                // switch_over (its work takes the new size)
};

struct MoveView {
  bool source = false;            // this host is the move's source (else its destination)
  MoveKind kind = MoveKind::live;
  bool in_place = false;          // source and destination are this host (a resize)
  MoveState state = MoveState::preparing;
  DomainState here = DomainState::absent;  // the guest's domain on this host
  bool job = false;               // a migration job runs on that domain (source)
  bool still_wanted = true;       // the work still asks for the guest (running, for a live move)
  bool overdue = false;           // its asker has not claimed, or the destination not prepared, in time (source)
  // The other host's agent holds its lease, or lost it only a moment ago (a restart): a peer
  // gone for longer never answers, and this side ends the move from what it knows.
  bool peer_alive = true;
  bool aborted = false;           // an operator asked the move undone
};
MoveAction decide_move(const MoveView& view);

// What the one standing in for the source of `move` sees when the source's host is dead for
// good (`toyvm evacuate`): its guest gone with the host, nothing more to send, a destination
// that answers for itself. decide_move over it ends the move as the source would.
MoveView dead_source_view(const MoveRecord& move);
std::string_view to_string(MoveAction action) noexcept;

// How long a live move of a guest using `resources` may take before it is aborted: Nova's
// live_migration_completion_timeout, `seconds_per_gib` for each GiB of its memory and disk (at
// least one GiB's worth).
std::chrono::milliseconds completion_timeout(const ResourceAmounts& resources, double seconds_per_gib);

// The instance's work as a resize to `query` makes it: its query and what it consumes.
// invalid_argument for a query that does not parse or that would shrink its disk.
result<WorkSpec> resized(WorkSpec work, std::string_view query);

std::string encode(const MoveRecord& move);
// corrupt_record, saying why, for anything malformed, including a kind or state this
// reader does not know (a newer writer's): never read as another.
result<MoveRecord> decode_move(std::string_view json);

}  // namespace toyvm
