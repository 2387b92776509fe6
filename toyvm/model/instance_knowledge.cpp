#include "model/instance_knowledge.hpp"

namespace toyvm {
namespace {

// The work a put carries for the instance `uuid`, or why it cannot be read.
result<WorkSpec> read_work(const news::WorkPut& put, const std::string& uuid) {
  auto spec = decode_work(put.value);
  if (spec && spec->uuid != uuid) return Error(errc::corrupt_record, "its uuid is not its key's");
  return spec;
}

struct Absorb {
  InstanceKnowledge& known;
  const std::string& host;

  Absorbed operator()(const news::WorkPut& put) const {
    // A listing taken before a watch event must not undo it (periodic resyncs run alongside);
    // an unreadable value is reported once, however often a resync lists it again.
    if (put.revision < known.work_revision) return Absorbed::stale;
    if (known.work_unreadable && put.revision == known.work_revision) return Absorbed::stale;
    // The revision known is the value known: a resync's listing of it. Its step, the net for
    // a libvirt event missed, is due unless the domain the listing found is as it should be.
    if (known.work && put.revision == known.work_revision)
      return put.domain && settled_with(known, *put.domain) ? Absorbed::stale : Absorbed::changed;
    auto spec = read_work(put, known.uuid);
    known.work_revision = put.revision;
    if (!spec) {
      known.work_unreadable = true;  // what it had stays: its guest, disk and allocation with it
      known.work_error = spec.error().message();
      return Absorbed::work_unreadable;
    }
    known.work = std::move(*spec);
    known.work_unreadable = false;
    known.work_error.clear();
    return Absorbed::changed;
  }
  Absorbed operator()(const news::WorkGone& gone) const {
    if (gone.revision < known.work_revision) return Absorbed::stale;  // a put came after the listing
    known.work_revision = gone.revision;
    if (!known.work && !known.work_unreadable) return Absorbed::stale;
    known.work.reset();
    known.work_unreadable = false;
    return Absorbed::changed;
  }
  Absorbed operator()(const news::MovePut& put) const {
    if (put.revision <= known.move_revision) return Absorbed::stale;  // a listing older than what is known
    known.move_revision = put.revision;
    known.move_unreadable = !put.move;
    known.move = put.move;
    return put.move ? Absorbed::changed : Absorbed::move_unreadable;
  }
  Absorbed operator()(const news::MoveGone& gone) const {
    if (!known.moving() || gone.revision < known.move_revision) return Absorbed::stale;
    known.prepared_here =
        known.move && known.move->destination == host && known.move->state != MoveState::switched;
    known.move.reset();
    known.move_unreadable = false;
    known.move_revision = gone.revision;
    known.recheck_work = true;
    return Absorbed::changed;
  }
  Absorbed operator()(const news::DomainChanged&) const { return Absorbed::changed; }
  Absorbed operator()(const news::AddressFound& found) const {
    if (found.ip.empty() || known.recorded() != Phase::active || !known.address.ip.empty()) return Absorbed::stale;
    known.address.ip = found.ip;
    known.address.unrecorded = true;
    return Absorbed::address_found;
  }
  Absorbed operator()(const news::AddressOverdue&) const {
    if (known.recorded() != Phase::active || !known.address.ip.empty() || known.address.given_up)
      return Absorbed::stale;
    known.address.given_up = true;
    known.address.unrecorded = true;
    return Absorbed::address_overdue;
  }
};

}  // namespace

Absorbed absorb(InstanceKnowledge& known, const News& news, const std::string& host) {
  return std::visit(Absorb{known, host}, news);
}

bool ends_work(const InstanceKnowledge& known, const News& news) {
  if (const auto* gone = std::get_if<news::WorkGone>(&news)) return gone->revision >= known.work_revision;
  const auto* put = std::get_if<news::WorkPut>(&news);
  if (!put || put->revision < known.work_revision) return false;
  auto spec = read_work(*put, known.uuid);
  return spec && spec->power == PowerState::deleted;
}

std::optional<std::string_view> ends_send(const InstanceKnowledge& known, const News& news) {
  if (const auto* put = std::get_if<news::WorkPut>(&news); put && put->revision >= known.work_revision)
    if (auto spec = read_work(*put, known.uuid); spec && spec->power != PowerState::running)
      return "it was stopped or destroyed";
  if (const auto* put = std::get_if<news::MovePut>(&news))
    if (put->move && put->revision > known.move_revision && put->move->abort) return "an operator aborted its move";
  return std::nullopt;
}

InstanceStep next_step(const InstanceKnowledge& known) {
  if (known.work_unreadable || known.move_unreadable) return InstanceStep::wait;
  if (known.recheck_work) return InstanceStep::recheck_work;
  if (known.prepared_here) return InstanceStep::remove_prepared;
  if (known.move) return InstanceStep::move;
  if (known.work && !known.phase) return InstanceStep::load_record;
  return InstanceStep::reconcile;
}

bool settled_with(const InstanceKnowledge& known, DomainState domain) {
  if (next_step(known) != InstanceStep::reconcile || known.address.unrecorded) return false;
  const Desired power = known.work ? Desired(known.work->power) : std::nullopt;
  return decide(power, domain, known.recorded()) == ReconcileAction::none;
}

std::string_view to_string(InstanceStep step) noexcept {
  switch (step) {
    case InstanceStep::wait: return "wait";
    case InstanceStep::recheck_work: return "recheck_work";
    case InstanceStep::remove_prepared: return "remove_prepared";
    case InstanceStep::move: return "move";
    case InstanceStep::load_record: return "load_record";
    case InstanceStep::reconcile: return "reconcile";
  }
  return "?";
}

}  // namespace toyvm
