#include "model/reconcile.hpp"

#include "catch_result.hpp"

#include <vector>

using namespace toyvm;
using A = ReconcileAction;
using P = Phase;
using D = DomainState;

namespace {
const Desired running = PowerState::running, stopped = PowerState::stopped, deleted = PowerState::deleted;
const Desired gone = std::nullopt;
}  // namespace

TEST_CASE("running work builds, starts, or records what already runs") {
  CHECK(decide(running, D::absent, P::unrecorded) == A::build);
  CHECK(decide(running, D::absent, P::building) == A::build);  // a build an agent's crash cut short
  CHECK(decide(running, D::stopped, P::unrecorded) == A::start);
  CHECK(decide(running, D::running, P::unrecorded) == A::record_active);  // adopted after a restart
  CHECK(decide(running, D::running, P::active) == A::none);               // a replayed event
}

TEST_CASE("an ERROR instance is never built again and gives back what it holds") {
  for (Desired power : {running, stopped}) {
    CHECK(decide(power, D::absent, P::failed) == A::release);  // after a restart too
    CHECK(decide(power, D::absent, P::released) == A::none);   // no retry loop
    CHECK(decide(power, D::running, P::released) == A::remove_domain);
    CHECK(decide(power, D::stopped, P::failed) == A::remove_domain);
  }
  CHECK(decide(deleted, D::absent, P::failed) == A::remove);
}

TEST_CASE("stopped work stops a running domain and records it once") {
  CHECK(decide(stopped, D::running, P::active) == A::stop);
  CHECK(decide(stopped, D::stopped, P::unrecorded) == A::record_stopped);
  CHECK(decide(stopped, D::stopped, P::stopped) == A::none);
}

TEST_CASE("a guest a move left paused is resumed if it is to run, stopped if not") {
  CHECK(decide(running, D::paused, P::active) == A::start);
  CHECK(decide(running, D::paused, P::unrecorded) == A::start);
  CHECK(decide(stopped, D::paused, P::active) == A::stop);
  CHECK(decide(stopped, D::paused, P::stopped) == A::stop);
  CHECK(decide(gone, D::paused, P::active) == A::remove_domain);
  CHECK(decide(running, D::paused, P::failed) == A::remove_domain);
}

TEST_CASE("deleted work is removed whatever the domain's state") {
  CHECK(decide(deleted, D::absent, P::unrecorded) == A::remove);
  CHECK(decide(deleted, D::running, P::active) == A::remove);
}

TEST_CASE("domains without work are destroyed; nothing without either") {
  CHECK(decide(gone, D::running, P::unrecorded) == A::remove_domain);
  CHECK(decide(gone, D::stopped, P::stopped) == A::remove_domain);
  CHECK(decide(gone, D::absent, P::unrecorded) == A::none);
}

TEST_CASE("a guest that stopped without toyvm stays stopped; a crash follows the policy") {
  using C = StopCause;
  // It powered itself off, or someone pulled the plug outside toyvm: STOPPED, desired follows.
  CHECK(decide(running, D::stopped, P::active, C::shutdown) == A::adopt_stop);
  CHECK(decide(running, D::stopped, P::active, C::destroyed) == A::adopt_stop);
  // Crashed: started again by default, ERROR if the policy says so.
  CHECK(decide(running, D::stopped, P::active, C::crashed) == A::start);
  CHECK(decide(running, D::stopped, P::active, C::crashed, CrashPolicy::error) == A::record_crash);
  // libvirt cannot say why (it or the host restarted): started again, as before.
  CHECK(decide(running, D::stopped, P::active, C::unknown) == A::start);
  // Recorded STOPPED and the user asked for it to run (toyvm start): started, whatever the cause.
  CHECK(decide(running, D::stopped, P::stopped, C::shutdown) == A::start);
  // Still building, or never recorded: a stop is not news about the guest.
  CHECK(decide(running, D::stopped, P::building, C::destroyed) == A::start);
  CHECK(decide(running, D::stopped, P::unrecorded, C::shutdown) == A::start);
  // Work that should be stopped or deleted never reaches the policy.
  CHECK(decide(stopped, D::stopped, P::active, C::crashed, CrashPolicy::error) == A::record_stopped);
  CHECK(decide(deleted, D::stopped, P::active, C::crashed, CrashPolicy::error) == A::remove);
}

// Every combination the agent can meet, against the rules the decision must keep whatever
// the case: a failed instance is never built or started, each action only where it makes sense,
// and a settled instance is left alone.
TEST_CASE("every combination keeps the rules") {
  const std::vector<Desired> desires{gone, running, stopped, deleted};
  const std::vector<D> domains{D::absent, D::running, D::paused, D::stopped};
  const std::vector<P> phases{P::unrecorded, P::building, P::active, P::stopped, P::failed, P::released};
  const std::vector<StopCause> causes{StopCause::unknown, StopCause::shutdown, StopCause::destroyed,
                                      StopCause::crashed};
  int combinations = 0;
  for (Desired desired : desires)
    for (D actual : domains)
      for (P phase : phases)
        for (StopCause cause : causes)
          for (CrashPolicy policy : {CrashPolicy::restart, CrashPolicy::error}) {
            ++combinations;
            const A action = decide(desired, actual, phase, cause, policy);
            INFO("desired " << (desired ? int(*desired) : -1) << ", domain " << int(actual) << ", phase "
                            << to_string(phase) << ", cause " << int(cause) << " -> " << to_string(action));
            const bool error = phase == P::failed || phase == P::released;
            if (!desired) CHECK(action == (actual == D::absent ? A::none : A::remove_domain));
            if (desired == deleted) CHECK(action == A::remove);
            if (!desired || desired == deleted) continue;
            if (error) {
              CHECK(action != A::build);
              CHECK(action != A::start);
              CHECK(action == (actual != D::absent ? A::remove_domain : phase == P::failed ? A::release : A::none));
              continue;
            }
            CHECK(action != A::release);
            CHECK(action != A::remove_domain);
            if (action == A::build) CHECK(actual == D::absent);
            if (actual == D::absent) CHECK(action == A::build);
            if (action == A::start) CHECK((desired == running && (actual == D::stopped || actual == D::paused)));
            if (action == A::stop) CHECK((desired == stopped && (actual == D::running || actual == D::paused)));
            // A guest left paused never stays so, whatever was recorded.
            if (actual == D::paused) CHECK(action == (desired == running ? A::start : A::stop));
            if (action == A::adopt_stop || action == A::record_crash)
              CHECK((desired == running && actual == D::stopped && phase == P::active));
            if (action == A::record_crash) CHECK((policy == CrashPolicy::error && cause == StopCause::crashed));
            // What runs as asked and is recorded so: nothing to do, however often it is asked.
            if (desired == running && actual == D::running) CHECK(action == (phase == P::active ? A::none : A::record_active));
            if (desired == stopped && actual == D::stopped) CHECK(action == (phase == P::stopped ? A::none : A::record_stopped));
          }
  CHECK(combinations == 4 * 4 * 6 * 4 * 2);
}
