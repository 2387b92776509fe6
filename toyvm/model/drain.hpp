#pragma once
// What `toyvm host drain` does next, from one look at its host: which guests to move now, which
// stay (they will not leave by themselves), and what is still on its way to or from the host
// (a schedule's claim not handed over yet, a move heading here, a build, a destroy). A drain
// is done when nothing is left but what stays; it says DRAINED only when nothing stays either.
// Pure: every case is unit-tested.

#include "model/moves.hpp"
#include "model/records.hpp"

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace toyvm {

struct DrainLook {
  struct Guest {
    std::string uuid;
    bool readable = true;                 // its work decodes
    PowerState power = PowerState::running;
    std::optional<InstanceState> state;   // its record's; none when it has none (yet)
  };
  std::string host;                    // the provider drained
  std::vector<Guest> guests;           // the work on the host
  std::vector<MoveRecord> moves;       // every move from or to the host
  std::vector<std::string> consumers;  // every consumer holding resources on the host's provider
};

struct DrainStep {
  using Why = std::pair<std::string, std::string>;  // instance or consumer, why
  std::vector<std::string> move;  // to be asked to move now
  std::vector<Why> stay;          // will not leave by itself
  std::vector<Why> wait;          // on its way to or from the host: looked at again
  bool done() const { return move.empty() && wait.empty(); }
};

// `busy`: the instances the drain is moving already (left out of this step).
DrainStep plan_drain(const DrainLook& look, const std::set<std::string>& busy);

}  // namespace toyvm
