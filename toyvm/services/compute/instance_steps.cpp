// The steps an instance takes towards what decide() asks: build, power on or off, remove,
// and what becomes of a build that failed or a guest that stopped without toyvm.

#include "services/compute/instance.hpp"

#include "core/failpoint.hpp"
#include "core/metrics.hpp"
#include "model/groups.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace toyvm::compute {

using namespace asio::experimental::awaitable_operators;
using namespace std::chrono_literals;

// How long a build goes before its record says BUILDING.
constexpr auto building_shown_after = 100ms;

// ACTIVE with a running domain (BUILDING meanwhile if that takes a while), or failed (fail()).
Step Instance::build(WorkSpec spec) {
  if (known_.allocation_elsewhere) {
    if (auto back = co_await steps_.builder.take_allocation_back(spec); !back) co_return back.error();
    known_.allocation_elsewhere = false;
  }
  int limit = ctx_.config.compute.max_instances;
  if (limit > 0 && steps_.presence.instance_count() > size_t(limit))
    co_return co_await fail(spec, Error(errc::host_full,
                                        fmt::format("host {} is full ({} instances)", ctx_.host.name, limit)));
  // A host being drained builds nothing new: the instance goes to another host with the
  // attempt it had (this one never tried); with no room elsewhere it is built here, and the
  // drain moves it on once it runs. A disable after this look finds it here, as that.
  auto disabled = co_await steps_.builder.host_disabled();
  if (!disabled) co_return disabled.error().doing("reading whether this host is disabled");
  if (*disabled) {
    WorkSpec unspent = spec;
    unspent.attempt -= 1;
    auto moved = co_await move_elsewhere(unspent);
    if (!moved) co_return moved.error().doing("moving it off this disabled host");
    if (*moved) co_return Next::rest;
    spdlog::warn("instance {}: host {} is disabled, and no other host has room: built here", spec.uuid,
                 ctx_.host.name);
  }
  if (!spec.group.empty()) {
    auto allowed = co_await steps_.builder.group_allows_here(spec);
    if (!allowed) co_return allowed.error().doing("reading its server group");
    if (!*allowed)
      co_return co_await fail(spec, Error(errc::no_valid_host,
                                          fmt::format("server group {} ({}) does not allow this host", spec.group,
                                                      spec.group_policy ? to_string(*spec.group_policy) : "no policy")));
  }
  spdlog::info("instance {}: building with image {} and {}", spec.uuid, spec.image, format_amounts(spec.resources));
  const auto started = std::chrono::steady_clock::now();
  co_await failpoint::pass("build.begin");
  // BUILDING is recorded once the build has taken a while (an image to fetch, a guest to
  // start), beside the making, so it costs no time; a build of a few milliseconds goes from
  // SCHEDULED to ACTIVE without an etcd commit, and an event to every watcher, that nobody
  // would have seen. Nothing else is recorded until etcd has answered, so records land in order.
  asio::steady_timer patience(ctx_.io, building_shown_after);
  auto [building, made] = co_await (record_building_if_slow(spec, patience) && make_domain_in_time(spec, patience));
  if (building && !*building) {
    // The work left this host, or etcd did not answer: nothing made for it stays.
    if (made.outcome == Made::Outcome::made) co_await ctx_.virt(&VirtBackend::destroy, spec.uuid);
    co_return building->error();
  }
  switch (made.outcome) {
    case Made::Outcome::cancelled: co_return Next::again;  // destroyed meanwhile: removing it releases what it holds
    case Made::Outcome::retry: co_return made.failure;
    case Made::Outcome::failed:
      steps_.presence.publish(spec.uuid);
      metrics::count("toyvm_builds_total", {{"result", "failed"}});
      co_return co_await fail(spec, made.failure);
    case Made::Outcome::made: break;
  }
  // Work that should be off (an evacuated STOPPED instance) is made and left off.
  const bool running = spec.power == PowerState::running;
  // The domain's key rides in the same transaction: one commit for a build, not two.
  std::vector<EtcdOp> domain_key;
  if (auto op = steps_.presence.domain_put(spec.uuid)) domain_key.push_back(std::move(*op));
  // Whatever address an earlier guest of this instance had is forgotten.
  known_.address.ip.clear();
  look_for_address();
  auto written = co_await record(make_record(spec, running ? InstanceState::active : InstanceState::stopped), domain_key);
  // The work left this host: nothing made for it stays. An unanswered write may have been
  // made, so the domain stays and the next round records it again.
  if (!written && written.error() == errc::changed) co_await ctx_.virt(&VirtBackend::destroy, spec.uuid);
  if (written && !domain_key.empty())
    steps_.presence.recorded(spec.uuid, domain_key.front());
  else
    steps_.presence.publish(spec.uuid);
  if (!written) co_return written.error();
  spdlog::info("instance {}: {}", spec.uuid, running ? "active" : "made, and stopped as its work says");
  metrics::count("toyvm_builds_total", {{"result", "active"}});
  metrics::observe("toyvm_build_seconds",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  co_return Next::rest;
}

// BUILDING, once `patience` expires before the domain is made; nothing when it was made (or
// failed) in time and there is nothing to say yet.
awaitable<std::optional<result<void>>> Instance::record_building_if_slow(WorkSpec spec, asio::steady_timer& patience) {
  auto [ec] = co_await patience.async_wait(asio::as_tuple(use_awaitable));
  if (ec) co_return std::nullopt;
  co_return co_await record_state(spec, InstanceState::building);
}

// The domain made, then `patience` cancelled. A destroy that comes while the image is awaited
// ends the wait.
awaitable<Made> Instance::make_domain_in_time(WorkSpec spec, asio::steady_timer& patience) {
  asio::steady_timer wake(ctx_.io, std::chrono::steady_clock::time_point::max());
  image_wait_ = &wake;
  BuildCancel cancel{[this] { return being_removed(); }, wake};
  Made made = co_await steps_.builder.make_domain(std::move(spec), std::move(cancel));
  image_wait_ = nullptr;
  patience.cancel();
  co_return made;
}

// ERROR with a reason code; the allocation and the group membership are given back.
// A build that failed here may succeed elsewhere (Nova's alternates): the instance moves
// to another live host while attempts remain; after the last it is ERROR no_valid_host.
// A bad image is bad everywhere: image_failure is final at once (Nova's BuildAbort).
Step Instance::fail(WorkSpec spec, Error failure) {
  std::string reason(reason_code(failure));
  std::string message = failure.message();
  spdlog::error("instance {}: {}: {}", spec.uuid, reason, message);
  if (failure != errc::image_failure) {
    if (spec.attempt < ctx_.config.compute.max_build_attempts) {
      auto moved = co_await move_elsewhere(spec);
      if (!moved) co_return moved.error().doing("moving it to another host");  // the whole step is retried
      if (*moved) co_return Next::rest;
    }
    message = fmt::format("no host could build it in {} attempt(s); the last said {}: {}", spec.attempt, reason,
                          message);
    reason = "no_valid_host";
  }
  // ERROR first, as releasing: from then on every round (and every restart) releases until
  // it is done, and only then says that the instance holds nothing.
  InstanceRecord failed = make_record(spec, InstanceState::error);
  failed.error_code = std::move(reason);
  failed.error_message = std::move(message);
  failed.releasing = true;
  if (auto written = co_await record(failed); !written) co_return written.error();
  metrics::count("toyvm_instance_failures_total", {{"reason", failed.error_code}});
  co_return co_await release_held(spec);
}

// true: moved; false: no other host fits; an error: it changed meanwhile, or Placement or
// etcd did not answer (the step is retried).
awaitable<result<bool>> Instance::move_elsewhere(WorkSpec spec) {
  if (being_removed()) co_return true;  // destroyed meanwhile: removing it releases what it holds
  WorkSpec work = *known_.work;
  work.attempt = spec.attempt;
  auto moved = co_await steps_.builder.move_elsewhere(std::move(work), known_.work_revision);
  if (!moved) co_return moved.error();
  switch (moved->outcome) {
    case Relocated::Outcome::moved:
      spdlog::info("instance {}: moved to host {} for attempt {}", spec.uuid, moved->host, spec.attempt + 1);
      co_return true;
    case Relocated::Outcome::no_room:
      co_return false;
    case Relocated::Outcome::stranded:  // taken back before it builds here again
      known_.allocation_elsewhere = true;
      break;
    case Relocated::Outcome::lost_race:
    case Relocated::Outcome::put_back:
      break;
  }
  if (moved->unknown.code) co_return moved->unknown;
  co_return Error(errc::changed, "its work or allocation changed while it was moved");
}

// An ERROR instance gives back what it holds; then its record stops saying "releasing".
Step Instance::release_held(WorkSpec spec) {
  if (auto given = co_await steps_.builder.give_back(spec); !given) co_return given.error();
  if (known_.failure && known_.failure->releasing) {
    InstanceRecord done = *known_.failure;
    done.releasing = false;
    done.updated_at = unix_millis();
    if (auto written = co_await record(std::move(done)); !written) co_return written.error();
  }
  known_.phase = Phase::released;
  spdlog::info("instance {}: ERROR; its allocation is released", spec.uuid);
  co_return Next::rest;
}

Step Instance::power_on_off(WorkSpec spec, bool on) {
  if (!on) co_await shut_down_gracefully();
  auto done = co_await ctx_.virt(on ? &VirtBackend::start : &VirtBackend::stop, spec.uuid);
  if (!done) co_return done.error().doing(on ? "starting it" : "stopping it");
  co_return rest_after(co_await record_state(spec, on ? InstanceState::active : InstanceState::stopped));
}

// Asks the guest to power off and waits up to stop_timeout for it; stop() then pulls the plug.
// The request is an ACPI button press, lost on a guest still booting (nothing listens for it
// yet), so it is pressed again every few seconds, as Nova does.
awaitable<void> Instance::shut_down_gracefully() {
  constexpr Duration ask_again = std::chrono::seconds(4);
  const Duration timeout = ctx_.config.compute.stop_timeout;
  auto asked = std::chrono::steady_clock::now();
  const auto deadline = asked + timeout;
  if (timeout <= Duration::zero() || !co_await ctx_.virt(&VirtBackend::shutdown, uuid_)) co_return;
  while (std::chrono::steady_clock::now() < deadline && co_await ctx_.stop.sleep(250ms)) {
    auto state = co_await ctx_.virt(&VirtBackend::state, uuid_);
    if (!state || *state != DomainState::running) co_return;
    if (std::chrono::steady_clock::now() - asked >= ask_again) {
      asked = std::chrono::steady_clock::now();
      co_await ctx_.virt(&VirtBackend::shutdown, uuid_);
    }
  }
  spdlog::info("instance {}: did not power off within {} s; forcing it off", uuid_, in_seconds(timeout));
}

// Domain first, then the allocation, then the keys: if any step fails the keys stay, and
// the next attempt finishes the job, so nothing leaks in Placement.
Step Instance::remove(WorkSpec spec) {
  auto gone = co_await ctx_.virt(&VirtBackend::destroy, spec.uuid);
  if (!gone) co_return gone.error().doing("destroying it");
  auto released = co_await ctx_.placement.release(spec.uuid);
  // A guest destroyed as it moved: its migration consumer's share goes too.
  if (released && known_.move) released = co_await ctx_.placement.release(known_.move->migration);
  if (!released) co_return released.error().doing("releasing its allocation");
  std::vector<EtcdOp> ops;
  for (auto& [key, range_end] : ctx_.keys.instance_keys(ctx_.host.provider, spec.uuid, spec.group, spec.project))
    ops.push_back(EtcdOp::erase(key, range_end));
  const EtcdOp domain_key = steps_.presence.domain_erase(spec.uuid);
  ops.push_back(domain_key);
  auto erased = co_await ctx_.etcd->txn({}, std::move(ops));
  if (!erased) co_return erased.error().doing("deleting its keys");
  spdlog::info("instance {}: deleted", spec.uuid);
  steps_.presence.recorded(spec.uuid, domain_key);
  co_return Next::rest;
}

awaitable<result<void>> Instance::remove_domain() {
  auto gone = co_await ctx_.virt(&VirtBackend::destroy, uuid_);
  steps_.presence.publish(uuid_);
  if (!gone) co_return gone.error().doing("destroying it");
  co_return result<void>{};
}

// The guest stopped without toyvm (it powered itself off, or someone stopped it outside
// toyvm): STOPPED, and its desired power with it, in one transaction guarded by the revision of
// the work that was seen, so that a start or destroy asked meanwhile wins.
Step Instance::adopt_stop(WorkSpec spec, int64_t revision) {
  const std::string work_key = ctx_.keys.work(ctx_.host.provider, spec.uuid);
  WorkSpec stopped = spec;
  stopped.power = PowerState::stopped;
  InstanceRecord record = steps_.recorder.make(spec, InstanceState::stopped);
  std::vector<EtcdCompare> unchanged{EtcdCompare::mod_revision_is(work_key, revision)};
  std::vector<EtcdOp> ops{EtcdOp::put(work_key, encode(stopped))};
  for (std::string& key : ctx_.keys.record_keys(spec.project, spec.uuid)) ops.push_back(EtcdOp::put(std::move(key), encode(record)));
  auto txn = co_await ctx_.etcd->txn(std::move(unchanged), std::move(ops));
  if (!txn) co_return txn.error().doing("recording that it stopped");
  if (txn->succeeded) {
    spdlog::info("instance {}: the guest stopped without toyvm; it is STOPPED until started", spec.uuid);
    metrics::count("toyvm_guest_events_total", {{"outcome", "stopped"}});
    known_.phase = Phase::stopped;
    known_.address.ip.clear();
  }
  co_return Next::rest;  // refused: the work changed, and the watch brings what it is now
}

// on_guest_crash = "error": ERROR launch_failure, recorded as releasing first; then the domain
// and its disk go and the allocation is given back (later rounds finish what fails here, as
// for any ERROR instance).
Step Instance::record_crash(WorkSpec spec) {
  InstanceRecord failed = make_record(spec, InstanceState::error);
  failed.error_code = "launch_failure";
  failed.error_message = "the guest crashed";
  failed.releasing = true;
  if (auto written = co_await record(failed); !written) co_return written.error();
  metrics::count("toyvm_guest_events_total", {{"outcome", "error"}});
  metrics::count("toyvm_instance_failures_total", {{"reason", "launch_failure"}});
  if (auto gone = co_await remove_domain(); !gone) co_return gone.error();
  co_return co_await release_held(spec);
}

// Its work as etcd has it now: a move that ended may have taken it here or away, and the
// work's own news may come later than the move's.
Step Instance::recheck_work() {
  auto listed = co_await ctx_.etcd->range(ctx_.keys.work(ctx_.host.provider, uuid_));
  if (!listed) co_return listed.error().doing("reading its work");
  known_.recheck_work = false;
  if (listed->kvs.empty()) take(news::WorkGone{listed->revision});
  else take(news::WorkPut{listed->kvs.front().mod_revision, listed->kvs.front().value, std::nullopt});
  co_return Next::again;
}

// Ended by someone else (an evacuation of its dead source, destroy --force): whatever arrived
// here has no work, and what was prepared for it is removed.
Step Instance::remove_prepared() {
  if (!known_.work && !known_.move) {
    auto removed = co_await ctx_.virt(&VirtBackend::destroy, uuid_);
    if (!removed) co_return removed.error().doing("removing what was prepared for its move");
  }
  known_.prepared_here = false;
  co_return Next::again;
}

}  // namespace toyvm::compute
