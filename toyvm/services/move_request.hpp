#pragma once
// Asking for a guest's move (`toyvm migrate`, `resize`, `host drain`): a move record written,
// guarded by the instance's work as read and by no other move of it being in flight, then the
// placer's one move engine (Placer::relocate) chooses the destination as a schedule would (or
// takes the one named), moves the books and names it in the record. The agents of both hosts
// do the rest (services/compute/instance_moves.cpp); the asker follows the record until it is
// gone and reads where the instance is then.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "model/moves.hpp"
#include "services/placer.hpp"

#include <string>

namespace toyvm {

// A host named by its agent's name or its provider uuid: its provider uuid.
awaitable<result<std::string>> resolve_host(Placement& placement, std::string host);

struct MoveAsked {
  MoveRecord move;
  int64_t revision = 0;  // of the record's write
};

struct MoveEnded {
  bool moved = false;
  std::string host;   // where the instance is now
  std::string error;  // not moved: why, as the source's agent said
};

class MoveRequests {
 public:
  MoveRequests(EtcdClient& etcd, Placer& placer, const KeyLayout& keys) : etcd_(etcd), placer_(placer), keys_(keys) {}

  // The move of instance `uuid` to `destination` (a provider uuid; empty: the best other live
  // host for its query and server group): live while it runs, or cold (powered off, its disk
  // copied) when `cold` or it is STOPPED; resized to the placement query `resize_to` when
  // given (cold, and its own host may be the destination). Errors: not_found,
  // invalid_argument (neither ACTIVE nor STOPPED, the destination is its host or not live, a
  // resize that would shrink its disk), no_allocations_left, changed (it changed, or moves
  // already), and etcd's and Placement's.
  awaitable<result<MoveAsked>> ask(std::string uuid, std::string destination, bool cold = false,
                                   std::string resize_to = "");
  // The move of `uuid` in flight asked undone (its record says abort; its source's agent ends
  // a live send that runs and undoes the move), while its guest has not left its source.
  // Errors: not_found (not moving), changed (its guest left already, or the record changed),
  // corrupt_record, and etcd's.
  awaitable<result<MoveAsked>> abort(std::string uuid);
  // Follows the record until the agents delete it; timeout when it is still there then.
  awaitable<result<MoveEnded>> follow(MoveAsked asked, Duration timeout);

 private:
  EtcdClient& etcd_;
  Placer& placer_;
  const KeyLayout& keys_;
};

}  // namespace toyvm
