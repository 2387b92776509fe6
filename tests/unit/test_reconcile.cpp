#include "model/reconcile.hpp"

#include "catch_result.hpp"

using namespace toyvm;
using A = ReconcileAction;
using S = InstanceState;
using D = DomainState;

namespace {
WorkSpec with_power(PowerState power) {
  WorkSpec spec;
  spec.uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";
  spec.power = power;
  return spec;
}
}  // namespace

TEST_CASE("running work builds, starts, or records what already runs") {
  WorkSpec spec = with_power(PowerState::running);
  CHECK(decide(&spec, D::absent, std::nullopt, false) == A::build);
  CHECK(decide(&spec, D::absent, S::scheduled, false) == A::build);
  CHECK(decide(&spec, D::stopped, std::nullopt, false) == A::start);
  CHECK(decide(&spec, D::running, std::nullopt, false) == A::record_active);  // adopted after a restart
  CHECK(decide(&spec, D::running, S::active, false) == A::none);               // a replayed event
}

TEST_CASE("an ERROR instance is never built again and gives back what it holds") {
  for (PowerState power : {PowerState::running, PowerState::stopped}) {
    WorkSpec spec = with_power(power);
    CHECK(decide(&spec, D::absent, S::error, false) == A::release);  // after a restart too
    CHECK(decide(&spec, D::absent, S::error, true) == A::none);      // no retry loop
    CHECK(decide(&spec, D::running, S::error, true) == A::remove_domain);
    CHECK(decide(&spec, D::stopped, S::error, false) == A::remove_domain);
  }
  WorkSpec deleted = with_power(PowerState::deleted);
  CHECK(decide(&deleted, D::absent, S::error, false) == A::remove);
}

TEST_CASE("stopped work stops a running domain and records it once") {
  WorkSpec spec = with_power(PowerState::stopped);
  CHECK(decide(&spec, D::running, S::active, false) == A::stop);
  CHECK(decide(&spec, D::stopped, std::nullopt, false) == A::record_stopped);
  CHECK(decide(&spec, D::stopped, S::stopped, false) == A::none);
}

TEST_CASE("deleted work is removed whatever the domain's state") {
  WorkSpec spec = with_power(PowerState::deleted);
  CHECK(decide(&spec, D::absent, std::nullopt, false) == A::remove);
  CHECK(decide(&spec, D::running, S::active, false) == A::remove);
}

TEST_CASE("domains without work are destroyed; nothing without either") {
  CHECK(decide(nullptr, D::running, std::nullopt, false) == A::remove_domain);
  CHECK(decide(nullptr, D::stopped, S::stopped, false) == A::remove_domain);
  CHECK(decide(nullptr, D::absent, std::nullopt, false) == A::none);
}

TEST_CASE("a guest that stopped without toyvm stays stopped; a crash follows the policy") {
  using C = StopCause;
  WorkSpec spec = with_power(PowerState::running);
  // It powered itself off, or someone pulled the plug outside toyvm: STOPPED, desired follows.
  CHECK(decide(&spec, D::stopped, S::active, false, C::shutdown) == A::adopt_stop);
  CHECK(decide(&spec, D::stopped, S::active, false, C::destroyed) == A::adopt_stop);
  // Crashed: started again by default, ERROR if the policy says so.
  CHECK(decide(&spec, D::stopped, S::active, false, C::crashed) == A::start);
  CHECK(decide(&spec, D::stopped, S::active, false, C::crashed, CrashPolicy::error) == A::record_crash);
  // libvirt cannot say why (it or the host restarted): started again, as before.
  CHECK(decide(&spec, D::stopped, S::active, false, C::unknown) == A::start);
  // Recorded STOPPED and the user asked for it to run (toyvm start): started, whatever the cause.
  CHECK(decide(&spec, D::stopped, S::stopped, false, C::shutdown) == A::start);
  // Still building, or never recorded: a stop is not news about the guest.
  CHECK(decide(&spec, D::stopped, S::building, false, C::destroyed) == A::start);
  CHECK(decide(&spec, D::stopped, std::nullopt, false, C::shutdown) == A::start);
  // Work that should be stopped or deleted never reaches the policy.
  WorkSpec stopped = with_power(PowerState::stopped);
  CHECK(decide(&stopped, D::stopped, S::active, false, C::crashed, CrashPolicy::error) == A::record_stopped);
  WorkSpec deleted = with_power(PowerState::deleted);
  CHECK(decide(&deleted, D::stopped, S::active, false, C::crashed, CrashPolicy::error) == A::remove);
}
