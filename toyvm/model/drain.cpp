#include "model/drain.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace toyvm {

DrainStep plan_drain(const DrainLook& look, const std::set<std::string>& busy) {
  DrainStep step;
  std::set<std::string> known;  // consumers explained by a guest or a move
  auto moving = [&](const std::string& uuid) {
    return std::any_of(look.moves.begin(), look.moves.end(), [&](const MoveRecord& m) { return m.instance == uuid; });
  };
  for (const DrainLook::Guest& guest : look.guests) {
    known.insert(guest.uuid);
    if (busy.count(guest.uuid)) continue;
    if (!guest.readable) {
      step.stay.emplace_back(guest.uuid, "its work cannot be read");
    } else if (guest.power == PowerState::deleted) {
      step.wait.emplace_back(guest.uuid, "it is being destroyed");
    } else if (moving(guest.uuid)) {
      step.wait.emplace_back(guest.uuid, "a move of it is under way");
    } else if (guest.state == InstanceState::active || guest.state == InstanceState::stopped) {
      step.move.push_back(guest.uuid);
    } else if (guest.state == InstanceState::error) {
      step.stay.emplace_back(guest.uuid, "it is ERROR (`toyvm destroy` removes it)");
    } else {
      step.wait.emplace_back(guest.uuid, fmt::format("it is {}: it moves once it is built",
                                                     guest.state ? to_string(*guest.state) : "not recorded yet"));
    }
  }
  for (const MoveRecord& move : look.moves) {
    known.insert(move.instance);
    known.insert(move.migration);
    const bool here = std::any_of(look.guests.begin(), look.guests.end(),
                                  [&](const DrainLook::Guest& g) { return g.uuid == move.instance; });
    if (here || busy.count(move.instance)) continue;
    step.wait.emplace_back(move.instance, move.destination == look.host
                                              ? fmt::format("it is moving here from host {}", move.source)
                                              : fmt::format("its move to host {} is settling", move.destination));
  }
  for (const std::string& consumer : look.consumers) {
    if (known.count(consumer) || busy.count(consumer)) continue;
    step.wait.emplace_back(consumer, "it holds resources here and has no work here yet (a schedule or a move on "
                                     "its way, or a leak `toyvm audit --fix` gives back)");
  }
  return step;
}

}  // namespace toyvm
