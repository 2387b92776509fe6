#include "model/reconcile.hpp"

namespace toyvm {

ReconcileAction decide(const WorkSpec* desired, DomainState actual, std::optional<InstanceState> recorded,
                       bool released, StopCause cause, CrashPolicy on_crash) {
  using A = ReconcileAction;
  if (!desired) return actual == DomainState::absent ? A::none : A::remove_domain;
  if (desired->power == PowerState::deleted) return A::remove;
  // ERROR is final and holds nothing: never built again (no retry loop, no guest running
  // without an allocation), whatever a restart forgot.
  if (recorded == InstanceState::error) {
    if (actual != DomainState::absent) return A::remove_domain;
    return released ? A::none : A::release;
  }
  if (actual == DomainState::absent) return A::build;  // stopped work is made and left off
  if (desired->power == PowerState::running) {
    if (actual == DomainState::stopped) {
      // A guest that ran and stopped without toyvm, as Nova treats it: one that powered itself
      // off (or was stopped outside toyvm) stays off and its desired power follows, never
      // started behind the user's back; a crash is per policy. A stop libvirt cannot explain
      // (it or the host restarted) is undone.
      if (recorded == InstanceState::active) {
        if (cause == StopCause::shutdown || cause == StopCause::destroyed) return A::adopt_stop;
        if (cause == StopCause::crashed && on_crash == CrashPolicy::error) return A::record_crash;
      }
      return A::start;
    }
    return recorded == InstanceState::active ? A::none : A::record_active;
  }
  if (actual == DomainState::running) return A::stop;
  return recorded == InstanceState::stopped ? A::none : A::record_stopped;
}

}  // namespace toyvm
