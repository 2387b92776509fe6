#include "model/reconcile.hpp"

namespace toyvm {

Phase phase_of(InstanceState recorded) {
  switch (recorded) {
    case InstanceState::building: return Phase::building;
    case InstanceState::active: return Phase::active;
    case InstanceState::stopped: return Phase::stopped;
    case InstanceState::error: return Phase::failed;
    case InstanceState::scheduled:
    case InstanceState::deleting: break;
  }
  return Phase::unrecorded;
}

std::optional<InstanceState> recorded_state(Phase phase) {
  switch (phase) {
    case Phase::unrecorded: break;
    case Phase::building: return InstanceState::building;
    case Phase::active: return InstanceState::active;
    case Phase::stopped: return InstanceState::stopped;
    case Phase::failed:
    case Phase::released: return InstanceState::error;
  }
  return std::nullopt;
}

std::string_view to_string(Phase phase) {
  switch (phase) {
    case Phase::unrecorded: return "unrecorded";
    case Phase::building: return "building";
    case Phase::active: return "active";
    case Phase::stopped: return "stopped";
    case Phase::failed: return "failed";
    case Phase::released: return "released";
  }
  return "?";
}

std::string_view to_string(ReconcileAction action) {
  using A = ReconcileAction;
  switch (action) {
    case A::none: return "none";
    case A::build: return "build";
    case A::start: return "start";
    case A::stop: return "stop";
    case A::record_active: return "record_active";
    case A::record_stopped: return "record_stopped";
    case A::remove: return "remove";
    case A::remove_domain: return "remove_domain";
    case A::release: return "release";
    case A::adopt_stop: return "adopt_stop";
    case A::record_crash: return "record_crash";
  }
  return "?";
}

ReconcileAction decide(Desired desired, DomainState actual, Phase phase, StopCause cause, CrashPolicy on_crash) {
  using A = ReconcileAction;
  if (!desired) return actual == DomainState::absent ? A::none : A::remove_domain;
  if (*desired == PowerState::deleted) return A::remove;
  // ERROR is final and holds nothing: never built again (no retry loop, no guest running
  // without an allocation), whatever a restart forgot.
  if (phase == Phase::failed || phase == Phase::released) {
    if (actual != DomainState::absent) return A::remove_domain;
    return phase == Phase::released ? A::none : A::release;
  }
  if (actual == DomainState::absent) return A::build;  // stopped work is made and left off
  if (*desired == PowerState::running) {
    if (actual == DomainState::stopped) {
      // A guest that ran and stopped without toyvm, as Nova treats it: one that powered itself
      // off (or was stopped outside toyvm) stays off and its desired power follows, never
      // started behind the user's back; a crash is per policy. A stop libvirt cannot explain
      // (it or the host restarted) is undone.
      if (phase == Phase::active) {
        if (cause == StopCause::shutdown || cause == StopCause::destroyed) return A::adopt_stop;
        if (cause == StopCause::crashed && on_crash == CrashPolicy::error) return A::record_crash;
      }
      return A::start;
    }
    // Paused by a move that ended without resuming it: no one else will.
    if (actual == DomainState::paused) return A::start;
    return phase == Phase::active ? A::none : A::record_active;
  }
  if (actual == DomainState::running || actual == DomainState::paused) return A::stop;
  return phase == Phase::stopped ? A::none : A::record_stopped;
}

}  // namespace toyvm
