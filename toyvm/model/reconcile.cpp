#include "model/reconcile.hpp"

namespace toyvm {

ReconcileAction decide(const WorkSpec* desired, DomainState actual, std::optional<InstanceState> recorded,
                       bool released) {
  using A = ReconcileAction;
  if (!desired) return actual == DomainState::absent ? A::none : A::remove_domain;
  if (desired->power == PowerState::deleted) return A::remove;
  // ERROR is final and holds nothing: never built again (no retry loop, no guest running
  // without an allocation), whatever a restart forgot.
  if (recorded == InstanceState::error) {
    if (actual != DomainState::absent) return A::remove_domain;
    return released ? A::none : A::release;
  }
  if (actual == DomainState::absent) return A::build;  // stopped work is stopped next round
  if (desired->power == PowerState::running) {
    if (actual == DomainState::stopped) return A::start;
    return recorded == InstanceState::active ? A::none : A::record_active;
  }
  if (actual == DomainState::running) return A::stop;
  return recorded == InstanceState::stopped ? A::none : A::record_stopped;
}

}  // namespace toyvm
