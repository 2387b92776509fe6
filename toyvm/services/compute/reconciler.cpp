#include "services/compute/reconciler.hpp"

#include "core/failpoint.hpp"
#include "core/metrics.hpp"
#include "model/reconcile.hpp"

#include <boost/asio/as_tuple.hpp>
#include <spdlog/spdlog.h>

#include <set>

namespace toyvm::compute {

using namespace std::chrono_literals;

std::optional<std::string> Reconciler::apply(const WatchEvent& event, bool listed) {
  auto key = ctx_.keys.parse_work(event.kv.key);
  if (!key || key->host != ctx_.host.provider) {
    spdlog::warn("ignoring key {} under the work prefix", event.kv.key);
    return std::nullopt;
  }
  auto [found, created] = parts_.slots.try_emplace(key->instance);
  InstanceSlot& slot = found->second;
  if (created && !listed) slot.recorded_loaded = true;  // nothing recorded before it
  // A listing taken before a watch event must not undo it (periodic resync runs alongside).
  if (event.kv.mod_revision < slot.revision) return key->instance;
  // Logged once per value, however often a resync lists it again.
  if (slot.unreadable && event.kv.mod_revision == slot.revision && event.type != WatchEvent::Type::erase)
    return key->instance;
  slot.revision = event.kv.mod_revision;
  if (event.type == WatchEvent::Type::erase) {
    slot.desired.reset();
  } else {
    std::string detail;
    auto spec = decode_work(event.kv.value, &detail);
    if (!spec || spec->uuid != key->instance) {
      // Unknown is not absent: the guest, its disk and its allocation stay as they are, and
      // the instance counts as listed, until a value this agent can read replaces it.
      spdlog::error("work {} cannot be read ({}); its instance is left as it is until it can", event.kv.key,
                    spec ? "its uuid is not its key's" : detail);
      slot.unreadable = true;
      return key->instance;
    }
    slot.desired = std::move(*spec);
  }
  slot.unreadable = false;
  if (slot.waiting && slot.cancelled()) slot.waiting->cancel();
  if (!listed) ++ctx_.activity;
  kick(key->instance);
  return key->instance;
}

awaitable<void> Reconciler::apply_listing(RangeResult listed) {
  std::set<std::string> seen;
  for (const KeyValue& kv : listed.kvs) {
    WatchEvent event{WatchEvent::Type::put, kv, std::nullopt};
    if (auto uuid = apply(event, true)) seen.insert(*uuid);
  }
  // Work that vanished while we were not watching (and did not appear after the listing),
  // and domains nobody asked for.
  for (auto& [uuid, slot] : parts_.slots) {
    if (!seen.count(uuid) && (slot.desired || slot.unreadable) && slot.revision <= listed.revision) {
      slot.desired.reset();
      slot.unreadable = false;
      kick(uuid);
    }
  }
  auto domains = co_await ctx_.virt(&VirtBackend::list);
  if (!domains) co_return;  // libvirt did not answer: the next resync looks again
  for (const std::string& uuid : domains.value) {
    if (!seen.count(uuid) && !parts_.slots.count(uuid)) kick(uuid);
  }
  parts_.presence.publish(domains.value);
  metrics::count("toyvm_work_listings_total");
}

void Reconciler::observe(const std::string& uuid, bool started) {
  auto slot = parts_.slots.find(uuid);
  if (slot == parts_.slots.end()) return;  // others are the resync's business
  // A domain that starts while a step runs for it is that step's own doing (builds and starts
  // are toyvm's); a second round to look at it would cost every build a libvirt call.
  if (started && slot->second.busy) return;
  kick(uuid);
}

void Reconciler::kick(const std::string& uuid) {
  InstanceSlot& slot = parts_.slots[uuid];
  if (slot.busy) {
    slot.dirty = true;
    return;
  }
  slot.busy = true;
  spawn_detached(ctx_.io, reconcile_loop(uuid), "instance " + uuid);
}

awaitable<void> Reconciler::reconcile_loop(std::string uuid) {
  while (true) {
    parts_.slots[uuid].dirty = false;
    bool settled = false;
    try {
      settled = co_await reconcile_once(uuid);
    } catch (const std::exception& e) {
      // A step that threw is a failed step: retried, and the slot is never left busy.
      spdlog::error("instance {}: {}; will retry", uuid, e.what());
    }
    InstanceSlot& slot = parts_.slots[uuid];
    if (!settled && !slot.dirty && !ctx_.stopping) {
      // A step failed on a server that may come back: try again later.
      asio::steady_timer timer(ctx_.io, retry_delay_);
      co_await timer.async_wait(use_awaitable);
      slot.dirty = true;
    }
    InstanceSlot& after = parts_.slots[uuid];
    if (!after.dirty || ctx_.stopping) {
      after.busy = false;
      if (!after.desired && !after.unreadable) parts_.slots.erase(uuid);
      co_return;
    }
  }
}

// One step towards the desired state; false when it must be retried.
awaitable<bool> Reconciler::reconcile_once(std::string uuid) {
  co_await failpoint::pass("reconcile.step");
  if (parts_.slots[uuid].unreadable) co_return true;  // nothing is decided on what cannot be read
  if (parts_.slots[uuid].desired && !co_await parts_.recorder.load(uuid)) co_return false;
  auto actual = co_await ctx_.virt(&VirtBackend::state, uuid);
  if (!actual) {
    spdlog::error("instance {}: libvirt: {}", uuid, actual.failure->message);
    co_return false;
  }
  const CrashPolicy on_crash = ctx_.config.compute.on_guest_crash == "error" ? CrashPolicy::error : CrashPolicy::restart;
  // Why it is off matters only for a guest that should run and was running.
  StopCause cause = StopCause::unknown;
  if (const InstanceSlot& before = parts_.slots[uuid]; actual.value == DomainState::stopped && before.desired &&
                                                        before.desired->power == PowerState::running &&
                                                        before.recorded == InstanceState::active) {
    auto why = co_await ctx_.virt(&VirtBackend::stop_cause, uuid);
    if (why) cause = why.value;
    if (cause == StopCause::crashed) spdlog::warn("instance {}: the guest crashed", uuid);
    if (cause == StopCause::crashed && on_crash == CrashPolicy::restart)
      metrics::count("toyvm_guest_events_total", {{"outcome", "restarted"}});
  }
  const InstanceSlot& slot = parts_.slots[uuid];
  std::optional<WorkSpec> desired = slot.desired;
  const int64_t revision = slot.revision;
  switch (decide(desired ? &*desired : nullptr, actual.value, slot.recorded, slot.released, cause, on_crash)) {
    case ReconcileAction::none: co_return true;
    case ReconcileAction::build: co_return co_await parts_.builder.build(*desired);
    case ReconcileAction::start: co_return co_await power(*desired, true);
    case ReconcileAction::stop: co_return co_await power(*desired, false);
    case ReconcileAction::record_active: co_return co_await parts_.recorder.record(*desired, InstanceState::active);
    case ReconcileAction::record_stopped: co_return co_await parts_.recorder.record(*desired, InstanceState::stopped);
    case ReconcileAction::remove: co_return co_await remove(*desired);
    case ReconcileAction::release: co_return co_await parts_.builder.release_held(*desired);
    case ReconcileAction::remove_domain: co_return co_await remove_domain(uuid);
    case ReconcileAction::adopt_stop: co_return co_await adopt_stop(*desired, revision);
    case ReconcileAction::record_crash: co_return co_await record_crash(*desired);
  }
  co_return true;
}

awaitable<bool> Reconciler::power(WorkSpec spec, bool on) {
  if (!on) co_await shut_down_gracefully(spec.uuid);
  auto done = co_await ctx_.virt(on ? &VirtBackend::start : &VirtBackend::stop, spec.uuid);
  if (!done) {
    spdlog::error("instance {}: {}", spec.uuid, done.failure->message);
    co_return false;
  }
  co_return co_await parts_.recorder.record(spec, on ? InstanceState::active : InstanceState::stopped);
}

// Asks the guest to power off and waits up to stop_timeout for it; stop() then pulls the plug.
awaitable<void> Reconciler::shut_down_gracefully(std::string uuid) {
  const double timeout_s = ctx_.config.compute.stop_timeout_s;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  if (timeout_s <= 0 || !co_await ctx_.virt(&VirtBackend::shutdown, uuid)) co_return;
  asio::steady_timer timer(ctx_.io);
  while (std::chrono::steady_clock::now() < deadline && !ctx_.stopping) {
    timer.expires_after(250ms);
    co_await timer.async_wait(asio::as_tuple(use_awaitable));
    auto state = co_await ctx_.virt(&VirtBackend::state, uuid);
    if (!state || state.value != DomainState::running) co_return;
  }
  spdlog::info("instance {}: did not power off within {} s; forcing it off", uuid, timeout_s);
}

// Domain first, then the allocation, then the keys: if any step fails the keys stay, and
// the next attempt finishes the job, so nothing leaks in Placement.
awaitable<bool> Reconciler::remove(WorkSpec spec) {
  auto gone = co_await ctx_.virt(&VirtBackend::destroy, spec.uuid);
  if (!gone) {
    spdlog::error("instance {}: destroying: {}", spec.uuid, gone.failure->message);
    co_return false;
  }
  auto released = co_await ctx_.placement.release(spec.uuid);
  if (!released) {
    spdlog::warn("instance {}: releasing its allocation: {}; will retry", spec.uuid, ctx_.placement.last_error().detail);
    co_return false;
  }
  std::vector<EtcdOp> ops;
  for (auto& [key, range_end] : ctx_.keys.instance_keys(ctx_.host.provider, spec.uuid, spec.group))
    ops.push_back(EtcdOp::erase(key, range_end));
  const EtcdOp domain_key = parts_.presence.domain_erase(spec.uuid);
  ops.push_back(domain_key);
  auto erased = co_await ctx_.etcd->txn({}, std::move(ops));
  if (!erased) co_return false;
  spdlog::info("instance {}: deleted", spec.uuid);
  parts_.presence.recorded(spec.uuid, domain_key);
  co_return true;
}

awaitable<bool> Reconciler::remove_domain(std::string uuid) {
  auto gone = co_await ctx_.virt(&VirtBackend::destroy, uuid);
  if (!gone) spdlog::error("instance {}: destroying: {}", uuid, gone.failure->message);
  parts_.presence.publish(uuid);
  co_return bool(gone);
}

// The guest stopped without toyvm (it powered itself off, or someone stopped it outside
// toyvm): STOPPED, and its desired power with it, in one transaction guarded by the revision of
// the work that was seen, so that a start or destroy asked meanwhile wins.
awaitable<bool> Reconciler::adopt_stop(WorkSpec spec, int64_t revision) {
  const std::string work_key = ctx_.keys.work(ctx_.host.provider, spec.uuid);
  WorkSpec stopped = spec;
  stopped.power = PowerState::stopped;
  InstanceRecord record = parts_.recorder.make(spec, InstanceState::stopped);
  std::vector<EtcdCompare> unchanged{EtcdCompare::mod_revision_is(work_key, revision)};
  std::vector<EtcdOp> ops{EtcdOp::put(work_key, encode(stopped)), EtcdOp::put(ctx_.keys.instance(spec.uuid), encode(record))};
  auto txn = co_await ctx_.etcd->txn(std::move(unchanged), std::move(ops));
  if (!txn) co_return false;
  if (txn->succeeded) {
    spdlog::info("instance {}: the guest stopped without toyvm; it is STOPPED until started", spec.uuid);
    metrics::count("toyvm_guest_events_total", {{"outcome", "stopped"}});
    InstanceSlot& slot = parts_.slots[spec.uuid];
    slot.recorded = InstanceState::stopped;
    slot.ip.clear();
  }
  co_return true;  // refused: the work changed, and the watch brings what it is now
}

// on_guest_crash = "error": ERROR launch_failure, recorded as releasing first; then the domain
// and its disk go and the allocation is given back (later rounds finish what fails here, as
// for any ERROR instance).
awaitable<bool> Reconciler::record_crash(WorkSpec spec) {
  InstanceRecord failed = parts_.recorder.make(spec, InstanceState::error);
  failed.error_code = "launch_failure";
  failed.error_message = "the guest crashed";
  failed.releasing = true;
  if (!co_await parts_.recorder.write(failed)) co_return false;
  metrics::count("toyvm_guest_events_total", {{"outcome", "error"}});
  metrics::count("toyvm_instance_failures_total", {{"reason", "launch_failure"}});
  if (!co_await remove_domain(spec.uuid)) co_return false;
  co_return co_await parts_.builder.release_held(spec);
}

}  // namespace toyvm::compute
