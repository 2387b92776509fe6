#include "services/compute/instance.hpp"

#include "core/failpoint.hpp"
#include "core/metrics.hpp"

#include <spdlog/spdlog.h>

namespace toyvm::compute {

using namespace std::chrono_literals;

// A step that failed on a server that may come back is tried again after this.
constexpr auto retry_delay = 1s;

Instance::Instance(InstanceSteps& steps, std::string uuid, bool fresh)
    : steps_(steps), ctx_(steps.ctx), uuid_(std::move(uuid)) {
  if (fresh) phase_ = Phase::unrecorded;
}

void Instance::take_work(const WatchEvent& event, bool listed) {
  // A listing taken before a watch event must not undo it (periodic resync runs alongside).
  if (event.kv.mod_revision < revision_) return;
  // Logged once per value, however often a resync lists it again.
  if (unreadable_ && event.kv.mod_revision == revision_ && event.type != WatchEvent::Type::erase) return;
  revision_ = event.kv.mod_revision;
  if (event.type == WatchEvent::Type::erase) {
    desired_.reset();
  } else {
    auto spec = decode_work(event.kv.value);
    if (!spec || spec->uuid != uuid_) {
      // Unknown is not absent: the guest, its disk and its allocation stay as they are, and
      // the instance counts as listed, until a value this agent can read replaces it.
      spdlog::error("work {} cannot be read ({}); its instance is left as it is until it can", event.kv.key,
                    spec ? "its uuid is not its key's" : spec.error().message());
      unreadable_ = true;
      return;
    }
    desired_ = std::move(*spec);
  }
  unreadable_ = false;
  if (image_wait_ && cancelled()) image_wait_->cancel();
  // A guest being sent is stopped or destroyed only once it stays here. (Work that left this
  // host went with the guest: its destination switched it over, and the send is ending.)
  if (sending_ && desired_ && desired_->power != PowerState::running) abort_sending("it was stopped or destroyed");
  if (!listed) ++ctx_.activity;
  kick();
}

void Instance::work_vanished(int64_t revision) {
  if ((!desired_ && !unreadable_) || revision_ > revision) return;  // news after the listing
  desired_.reset();
  unreadable_ = false;
  if (image_wait_) image_wait_->cancel();
  kick();
}

void Instance::take_move(const KeyValue& kv, std::optional<MoveRecord> move) {
  if (kv.mod_revision <= move_revision_) return;  // a listing older than what is known
  move_revision_ = kv.mod_revision;
  move_unreadable_ = !move;
  if (!move) {
    spdlog::error("move {} cannot be read; instance {} is left as it is until it can", kv.key, uuid_);
    move_.reset();
    return;
  }
  move_ = std::move(move);
  if (sending_ && move_->abort) abort_sending("an operator aborted its move");
  kick();
}

void Instance::move_vanished(int64_t revision) {
  if (!moving() || revision < move_revision_) return;
  prepared_here_ = move_ && move_->destination == ctx_.host.provider && move_->state != MoveState::switched;
  move_.reset();
  move_unreadable_ = false;
  move_revision_ = revision;
  recheck_work_ = true;
  kick();
}

void Instance::domain_changed(bool started) {
  // A domain that starts while a step runs is that step's own doing (builds and starts are
  // toyvm's); a second round to look at it would cost every build a libvirt call.
  if (started && run_ != Run::idle) return;
  kick();
}

void Instance::kick() {
  if (run_ != Run::idle) {
    run_ = Run::again;
    return;
  }
  run_ = Run::stepping;
  spawn_detached(ctx_.io, run(shared_from_this()), "instance " + uuid_);
}

// `self` keeps the instance alive until its last step ends, even once it is forgotten.
awaitable<void> Instance::run([[maybe_unused]] std::shared_ptr<Instance> self) {
  while (true) {
    run_ = Run::stepping;
    bool settled = false;
    try {
      settled = co_await step();
    } catch (const std::exception& e) {
      // A step that threw is a failed step: retried, and the instance is never left stepping.
      spdlog::error("instance {}: {}; will retry", uuid_, e.what());
    }
    if (!settled && run_ != Run::again && !ctx_.stop.requested()) {
      co_await ctx_.stop.sleep(retry_delay);
      run_ = Run::again;
    }
    if (run_ != Run::again || ctx_.stop.requested()) {
      run_ = Run::idle;
      if (!desired_ && !unreadable_ && !moving()) steps_.forget(uuid_);
      co_return;
    }
  }
}

awaitable<bool> Instance::step() {
  co_await failpoint::pass("reconcile.step");
  if (unreadable_ || move_unreadable_) co_return true;  // nothing is decided on what cannot be read
  if (recheck_work_ && !co_await recheck_work()) co_return false;
  if (std::exchange(prepared_here_, false) && !desired_ && !move_) {
    // Ended by someone else (an evacuation of its dead source, destroy --force): whatever
    // arrived here has no work, and what was prepared for it is removed.
    auto removed = co_await ctx_.virt(&VirtBackend::destroy, uuid_);
    if (!removed) prepared_here_ = true;
  }
  if (move_)
    if (auto moved = co_await step_move()) co_return *moved;
  if (desired_ && !phase_ && !co_await load_recorded()) co_return false;
  auto actual = co_await ctx_.virt(&VirtBackend::state, uuid_);
  if (!actual) {
    spdlog::error("instance {}: libvirt: {}", uuid_, actual.error().message());
    co_return false;
  }
  const CrashPolicy on_crash = ctx_.config.compute.on_guest_crash == "error" ? CrashPolicy::error : CrashPolicy::restart;
  // Why it is off matters only for a guest that should run and was running.
  StopCause cause = StopCause::unknown;
  if (*actual == DomainState::stopped && desired_ && desired_->power == PowerState::running &&
      phase() == Phase::active) {
    auto why = co_await ctx_.virt(&VirtBackend::stop_cause, uuid_);
    if (why) cause = *why;
    if (cause == StopCause::crashed) spdlog::warn("instance {}: the guest crashed", uuid_);
    if (cause == StopCause::crashed && on_crash == CrashPolicy::restart)
      metrics::count("toyvm_guest_events_total", {{"outcome", "restarted"}});
  }
  // As it is now: news may have come while libvirt was asked.
  const std::optional<WorkSpec> desired = desired_;
  const int64_t revision = revision_;
  const Desired power = desired ? Desired(desired->power) : std::nullopt;
  switch (decide(power, *actual, phase(), cause, on_crash)) {
    case ReconcileAction::none:
      // Its address (or that none came) is news this instance records itself, at rest.
      if (address_.unrecorded && phase() == Phase::active) co_return co_await record_state(*desired, InstanceState::active);
      co_return true;
    case ReconcileAction::build: co_return co_await build(*desired);
    case ReconcileAction::start: co_return co_await power_on_off(*desired, true);
    case ReconcileAction::stop: co_return co_await power_on_off(*desired, false);
    case ReconcileAction::record_active: co_return co_await record_state(*desired, InstanceState::active);
    case ReconcileAction::record_stopped: co_return co_await record_state(*desired, InstanceState::stopped);
    case ReconcileAction::remove: co_return co_await remove(*desired);
    case ReconcileAction::release: co_return co_await release_held(*desired);
    case ReconcileAction::remove_domain: co_return co_await remove_domain();
    case ReconcileAction::adopt_stop: co_return co_await adopt_stop(*desired, revision);
    case ReconcileAction::record_crash: co_return co_await record_crash(*desired);
  }
  co_return true;
}

// Memory is empty after a restart, and an ERROR decided before it must stay ERROR.
awaitable<bool> Instance::load_recorded() {
  auto found = co_await steps_.recorder.read(uuid_);
  if (!found) co_return false;
  if (phase_) co_return true;  // recorded meanwhile
  phase_ = Phase::unrecorded;
  if (!*found) co_return true;
  const InstanceRecord& record = **found;
  phase_ = phase_of(record.state);
  if (record.state == InstanceState::error) failure_ = record;
  if (record.state == InstanceState::active) {
    // Still looking when the last agent stopped: look for a full address_timeout again.
    look_for_address();
    address_.ip = record.ip;
    address_.given_up = record.no_address;
  }
  co_return true;
}

InstanceRecord Instance::make_record(const WorkSpec& spec, InstanceState state) const {
  return steps_.recorder.make(spec, state, address_.ip, address_.given_up);
}

awaitable<InstanceRecorder::Written> Instance::record(InstanceRecord record, std::vector<EtcdOp> also) {
  // Only an ERROR record is kept (to rewrite once released); any other is not copied.
  const InstanceState state = record.state;
  std::optional<InstanceRecord> failed;
  if (state == InstanceState::error) failed = record;
  const auto outcome = co_await steps_.recorder.write(std::move(record), std::move(also));
  if (outcome != InstanceRecorder::Written::made) co_return outcome;
  phase_ = phase_of(state);
  failure_ = std::move(failed);
  address_.unrecorded = false;  // every record carries the address as it is known
  co_return outcome;
}

// A guest that just became ACTIVE is looked for an address afresh.
awaitable<bool> Instance::record_state(WorkSpec spec, InstanceState state) {
  if (state == InstanceState::active && phase() != Phase::active) look_for_address();
  if (state != InstanceState::active) address_.ip.clear();
  co_return co_await record(make_record(spec, state)) == InstanceRecorder::Written::made;
}

// A guest that just started gets an address from DHCP: looked for until address_timeout.
void Instance::look_for_address() {
  address_.deadline = std::chrono::steady_clock::now() +
                      ctx_.config.compute.address_timeout;
  address_.given_up = false;
}

Instance::AddressSearch Instance::address_search(std::chrono::steady_clock::time_point now) const {
  if (!ctx_.has_nic() || !at_rest() || phase() != Phase::active || !address_.ip.empty() || address_.given_up)
    return AddressSearch::none;
  return now < address_.deadline ? AddressSearch::looking : AddressSearch::overdue;
}

void Instance::take_addresses(std::vector<GuestAddress> found) {
  if (found.empty() || phase() != Phase::active || !address_.ip.empty()) return;
  const std::string mac = instance_mac(uuid_);
  address_.ip = found.front().ip;
  for (const GuestAddress& address : found)
    if (address.mac == mac) address_.ip = address.ip;
  spdlog::info("instance {}: address {}", uuid_, address_.ip);
  address_.unrecorded = true;
  kick();
}

void Instance::give_up_address() {
  if (phase() != Phase::active || !address_.ip.empty() || address_.given_up) return;
  address_.given_up = true;
  spdlog::warn("instance {}: no address within address_timeout ({} s); no longer looking", uuid_,
               in_seconds(ctx_.config.compute.address_timeout));
  address_.unrecorded = true;
  kick();
}

}  // namespace toyvm::compute
