#include "model/reconcile.hpp"

namespace toyvm {

ReconcileAction decide(const WorkSpec* desired, DomainState actual,
                       std::optional<InstanceState> recorded) {
  using A = ReconcileAction;
  if (!desired) return actual == DomainState::absent ? A::none : A::remove_domain;
  switch (desired->power) {
    case PowerState::deleted:
      return A::remove;
    case PowerState::running:
      if (actual == DomainState::absent)
        return recorded == InstanceState::error ? A::none : A::build;  // no retry loop on failure
      if (actual == DomainState::stopped) return A::start;
      return recorded == InstanceState::active ? A::none : A::record_active;
    case PowerState::stopped:
      if (actual == DomainState::absent)
        return recorded == InstanceState::error ? A::none : A::build;  // then stopped next round
      if (actual == DomainState::running) return A::stop;
      return recorded == InstanceState::stopped ? A::none : A::record_stopped;
  }
  return A::none;
}

}  // namespace toyvm
