// What a drain does next from one look at its host (model/drain.hpp): every kind of guest,
// move and claim it can meet.

#include "model/drain.hpp"

#include <catch2/catch.hpp>

using namespace toyvm;

namespace {

const std::string host = "host-a", other = "host-b";

DrainLook::Guest guest(std::string uuid, std::optional<InstanceState> state, PowerState power = PowerState::running) {
  return DrainLook::Guest{std::move(uuid), true, power, state};
}

MoveRecord move(std::string instance, std::string source, std::string destination) {
  MoveRecord m;
  m.instance = std::move(instance);
  m.migration = "mig-" + m.instance;
  m.source = std::move(source);
  m.destination = std::move(destination);
  m.state = MoveState::claimed;
  return m;
}

std::vector<std::string> firsts(const std::vector<DrainStep::Why>& whys) {
  std::vector<std::string> out;
  for (const auto& [what, why] : whys) out.push_back(what);
  return out;
}

}  // namespace

TEST_CASE("an empty host with nothing on its way is drained") {
  DrainLook look{host, {}, {}, {}};
  DrainStep step = plan_drain(look, {});
  CHECK(step.done());
  CHECK(step.stay.empty());
}

TEST_CASE("running and stopped guests are moved; ERROR and unreadable ones stay") {
  DrainLook look{host,
                 {guest("on", InstanceState::active), guest("off", InstanceState::stopped),
                  guest("bad", InstanceState::error), DrainLook::Guest{"junk", false, PowerState::running, {}}},
                 {},
                 {"on", "off"}};
  DrainStep step = plan_drain(look, {});
  CHECK(step.move == std::vector<std::string>{"on", "off"});
  CHECK(firsts(step.stay) == std::vector<std::string>{"bad", "junk"});
  CHECK(step.wait.empty());
  CHECK_FALSE(step.done());
}

TEST_CASE("guests being moved by the drain are left alone, with their claims") {
  DrainLook look{host, {guest("on", InstanceState::active)}, {move("on", host, other)}, {"on", "mig-on"}};
  DrainStep step = plan_drain(look, {"on"});
  CHECK(step.done());
}

TEST_CASE("a guest still building, being destroyed or moved by someone else is waited for") {
  DrainLook look{host,
                 {guest("new", InstanceState::scheduled), guest("slow", InstanceState::building),
                  guest("norecord", std::nullopt), guest("going", InstanceState::active, PowerState::deleted),
                  guest("moving", InstanceState::active)},
                 {move("moving", host, other)},
                 {}};
  DrainStep step = plan_drain(look, {});
  CHECK(step.move.empty());
  CHECK(firsts(step.wait) == std::vector<std::string>{"new", "slow", "norecord", "going", "moving"});
}

TEST_CASE("a claim not handed over yet and a move heading here are on their way: waited for") {
  DrainLook look{host, {}, {move("incoming", other, host)}, {"claimed", "incoming", "mig-incoming"}};
  DrainStep step = plan_drain(look, {});
  CHECK(firsts(step.wait) == std::vector<std::string>{"incoming", "claimed"});
  CHECK_FALSE(step.done());
}

TEST_CASE("a move from here whose work has left is settling: waited for until its record goes") {
  DrainLook look{host, {}, {move("left", host, other)}, {"mig-left"}};
  DrainStep step = plan_drain(look, {});
  CHECK(firsts(step.wait) == std::vector<std::string>{"left"});
}
