// What a host knows of one instance, changed only by news: every kind of news against what is
// known, and the next step each state leads to.
#include "model/instance_knowledge.hpp"

#include "catch_result.hpp"

using namespace toyvm;
using S = InstanceStep;

namespace {

const std::string here = "host-here", there = "host-there";

WorkSpec work(PowerState power = PowerState::running) {
  WorkSpec spec;
  spec.uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";
  spec.power = power;
  return spec;
}

MoveRecord move_to(const std::string& destination, MoveState state = MoveState::claimed, bool abort = false) {
  MoveRecord move;
  move.instance = work().uuid;
  move.source = destination == here ? there : here;
  move.destination = destination;
  move.state = state;
  move.abort = abort;
  return move;
}

InstanceKnowledge running_at(int64_t revision) {
  InstanceKnowledge known;
  known.uuid = work().uuid;
  known.work = work();
  known.work_revision = revision;
  known.phase = Phase::active;
  return known;
}

}  // namespace

TEST_CASE("work news older than what is known changes nothing") {
  InstanceKnowledge known = running_at(10);
  CHECK(absorb(known, news::WorkPut{9, encode(work(PowerState::stopped)), {}}, here) == Absorbed::stale);
  CHECK(absorb(known, news::WorkGone{9}, here) == Absorbed::stale);
  CHECK(known.work->power == PowerState::running);
  CHECK(absorb(known, news::WorkPut{11, encode(work(PowerState::stopped)), {}}, here) == Absorbed::changed);
  CHECK(known.work->power == PowerState::stopped);
  CHECK(known.work_revision == 11);
}

TEST_CASE("work that cannot be read keeps what was known, and is told of once") {
  InstanceKnowledge known = running_at(10);
  CHECK(absorb(known, news::WorkPut{12, "damaged", {}}, here) == Absorbed::work_unreadable);
  CHECK(known.work);  // unknown is not absent
  CHECK_FALSE(known.work_error.empty());
  CHECK_FALSE(known.forgettable());
  CHECK(next_step(known) == S::wait);
  CHECK(absorb(known, news::WorkPut{12, "damaged", {}}, here) == Absorbed::stale);  // the resync's listing
  CHECK(absorb(known, news::WorkPut{13, encode(work()), {}}, here) == Absorbed::changed);
  CHECK_FALSE(known.work_unreadable);
  CHECK(next_step(known) == S::reconcile);
}

TEST_CASE("a listing of work already known asks for a step only when its domain is not as it should be") {
  InstanceKnowledge known = running_at(10);
  const std::string value = encode(work());
  CHECK(absorb(known, news::WorkPut{10, value, DomainState::running}, here) == Absorbed::stale);
  CHECK(absorb(known, news::WorkPut{10, value, {}}, here) == Absorbed::changed);  // libvirt did not say
  for (DomainState wrong : {DomainState::stopped, DomainState::paused, DomainState::absent})
    CHECK(absorb(known, news::WorkPut{10, value, wrong}, here) == Absorbed::changed);
  // The revision names the value: it is not read again.
  CHECK(absorb(known, news::WorkPut{10, "damaged", DomainState::running}, here) == Absorbed::stale);
  CHECK_FALSE(known.work_unreadable);
  // A newer value is read, whatever the domain: stopped work, its guest still running.
  const std::string stopped = encode(work(PowerState::stopped));
  CHECK(absorb(known, news::WorkPut{11, stopped, DomainState::running}, here) == Absorbed::changed);
  CHECK(known.work->power == PowerState::stopped);
  CHECK(absorb(known, news::WorkPut{11, stopped, DomainState::stopped}, here) == Absorbed::changed);  // to record
  known.phase = Phase::stopped;
  CHECK(absorb(known, news::WorkPut{11, stopped, DomainState::stopped}, here) == Absorbed::stale);
}

TEST_CASE("an instance is settled with its domain only when its next step would decide nothing") {
  const InstanceKnowledge active = running_at(10);
  CHECK(settled_with(active, DomainState::running));
  CHECK_FALSE(settled_with(active, DomainState::stopped));
  InstanceKnowledge unrecorded_ip = active;
  unrecorded_ip.address.unrecorded = true;  // its address is to be recorded
  CHECK_FALSE(settled_with(unrecorded_ip, DomainState::running));
  InstanceKnowledge restarted = active;
  restarted.phase.reset();  // its record not read back yet
  CHECK_FALSE(settled_with(restarted, DomainState::running));
  InstanceKnowledge moving = active;
  moving.move = move_to(there);
  CHECK_FALSE(settled_with(moving, DomainState::running));
  InstanceKnowledge released = active;
  released.phase = Phase::released;
  CHECK(settled_with(released, DomainState::absent));
  CHECK_FALSE(settled_with(released, DomainState::stopped));
}

TEST_CASE("work that names another instance is not this one's") {
  InstanceKnowledge known = running_at(10);
  WorkSpec other = work(PowerState::deleted);
  other.uuid = "5b9c3e5e-8d7e-4a57-9d36-2f0d4a9c0001";
  CHECK(absorb(known, news::WorkPut{11, encode(other), {}}, here) == Absorbed::work_unreadable);
  CHECK(known.work->power == PowerState::running);
  CHECK_FALSE(ends_work(running_at(10), news::WorkPut{11, encode(other), {}}));
}

TEST_CASE("work gone is news once, and a put before the listing that said so is stale") {
  InstanceKnowledge known = running_at(10);
  CHECK(absorb(known, news::WorkGone{15}, here) == Absorbed::changed);
  CHECK_FALSE(known.work);
  CHECK(known.forgettable());
  CHECK(absorb(known, news::WorkGone{16}, here) == Absorbed::stale);
  CHECK(absorb(known, news::WorkPut{14, encode(work()), {}}, here) == Absorbed::stale);
}

TEST_CASE("a move's news is taken once, in order, and its end asks for the work again") {
  InstanceKnowledge known = running_at(10);
  CHECK(absorb(known, news::MovePut{20, move_to(there)}, here) == Absorbed::changed);
  CHECK(known.moving());
  CHECK(next_step(known) == S::move);
  CHECK(absorb(known, news::MovePut{20, move_to(there, MoveState::ready)}, here) == Absorbed::stale);
  CHECK(absorb(known, news::MoveGone{19}, here) == Absorbed::stale);
  CHECK(absorb(known, news::MoveGone{21}, here) == Absorbed::changed);
  CHECK_FALSE(known.moving());
  CHECK_FALSE(known.prepared_here);  // this host was its source
  CHECK(next_step(known) == S::recheck_work);
  CHECK(absorb(known, news::MoveGone{22}, here) == Absorbed::stale);  // not moving: nothing ended
}

TEST_CASE("a move here that ended unseen leaves what was prepared to remove") {
  InstanceKnowledge known;
  CHECK(absorb(known, news::MovePut{5, move_to(here, MoveState::ready)}, here) == Absorbed::changed);
  CHECK(absorb(known, news::MoveGone{6}, here) == Absorbed::changed);
  CHECK(known.prepared_here);
  known.recheck_work = false;  // read: no work came
  CHECK(next_step(known) == S::remove_prepared);
  // Switched over: the guest is this host's, nothing to remove.
  InstanceKnowledge switched;
  absorb(switched, news::MovePut{5, move_to(here, MoveState::switched)}, here);
  absorb(switched, news::MoveGone{6}, here);
  CHECK_FALSE(switched.prepared_here);
}

TEST_CASE("a move that cannot be read holds every decision") {
  InstanceKnowledge known = running_at(10);
  CHECK(absorb(known, news::MovePut{20, std::nullopt}, here) == Absorbed::move_unreadable);
  CHECK(known.moving());
  CHECK_FALSE(known.forgettable());
  CHECK(next_step(known) == S::wait);
  CHECK(absorb(known, news::MoveGone{21}, here) == Absorbed::changed);
  CHECK_FALSE(known.move_unreadable);
}

TEST_CASE("an address is taken once, for an ACTIVE guest, and so is giving up on it") {
  InstanceKnowledge known = running_at(10);
  known.phase = Phase::building;
  CHECK(absorb(known, news::AddressFound{"192.0.2.7"}, here) == Absorbed::stale);
  known.phase = Phase::active;
  CHECK(absorb(known, news::AddressFound{""}, here) == Absorbed::stale);
  CHECK(absorb(known, news::AddressFound{"192.0.2.7"}, here) == Absorbed::address_found);
  CHECK(known.address.unrecorded);
  CHECK(absorb(known, news::AddressFound{"192.0.2.8"}, here) == Absorbed::stale);
  CHECK(known.address.ip == "192.0.2.7");
  CHECK(absorb(known, news::AddressOverdue{}, here) == Absorbed::stale);  // it came

  InstanceKnowledge silent = running_at(10);
  CHECK(absorb(silent, news::AddressOverdue{}, here) == Absorbed::address_overdue);
  CHECK(silent.address.given_up);
  CHECK(absorb(silent, news::AddressOverdue{}, here) == Absorbed::stale);
}

TEST_CASE("a step is due for news that changed something, and none for what is left alone") {
  CHECK(step_due(Absorbed::changed));
  CHECK(step_due(Absorbed::address_found));
  CHECK(step_due(Absorbed::address_overdue));
  CHECK_FALSE(step_due(Absorbed::stale));
  CHECK_FALSE(step_due(Absorbed::work_unreadable));
  CHECK_FALSE(step_due(Absorbed::move_unreadable));
  InstanceKnowledge known;
  CHECK(absorb(known, news::DomainChanged{false}, here) == Absorbed::changed);
}

TEST_CASE("news not yet absorbed ends a build only when it removes the work, and is not stale") {
  InstanceKnowledge known = running_at(10);
  CHECK(ends_work(known, news::WorkGone{11}));
  CHECK_FALSE(ends_work(known, news::WorkGone{9}));
  CHECK(ends_work(known, news::WorkPut{11, encode(work(PowerState::deleted)), {}}));
  CHECK_FALSE(ends_work(known, news::WorkPut{11, encode(work(PowerState::stopped)), {}}));
  CHECK_FALSE(ends_work(known, news::WorkPut{11, "{not work", {}}));  // unreadable: no reason to remove
  CHECK_FALSE(ends_work(known, news::MoveGone{11}));
}

TEST_CASE("a live send ends for a stop, a destroy or an abort, not for work that left with the guest") {
  InstanceKnowledge known = running_at(10);
  known.move = move_to(there, MoveState::ready);
  known.move_revision = 20;
  CHECK(ends_send(known, news::WorkPut{11, encode(work(PowerState::stopped)), {}}));
  CHECK(ends_send(known, news::WorkPut{11, encode(work(PowerState::deleted)), {}}));
  CHECK_FALSE(ends_send(known, news::WorkPut{11, encode(work(PowerState::running)), {}}));
  CHECK_FALSE(ends_send(known, news::WorkPut{9, encode(work(PowerState::stopped)), {}}));
  CHECK_FALSE(ends_send(known, news::WorkGone{11}));
  CHECK(ends_send(known, news::MovePut{21, move_to(there, MoveState::ready, true)}));
  CHECK_FALSE(ends_send(known, news::MovePut{20, move_to(there, MoveState::ready, true)}));
  CHECK_FALSE(ends_send(known, news::MovePut{21, move_to(there, MoveState::ready)}));
}

TEST_CASE("the next step, in order of what must come first") {
  InstanceKnowledge known;
  CHECK(next_step(known) == S::reconcile);  // no work: a domain nobody asked for, if any
  known.work = work();
  CHECK(next_step(known) == S::load_record);  // after a restart: what was recorded first
  known.phase = Phase::active;
  CHECK(next_step(known) == S::reconcile);
  known.move = move_to(there);
  CHECK(next_step(known) == S::move);
  known.prepared_here = true;
  CHECK(next_step(known) == S::remove_prepared);
  known.recheck_work = true;
  CHECK(next_step(known) == S::recheck_work);
  known.move_unreadable = true;
  CHECK(next_step(known) == S::wait);
  for (S step : {S::wait, S::recheck_work, S::remove_prepared, S::move, S::load_record, S::reconcile})
    CHECK(to_string(step) != "?");
}
