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
  known_.uuid = uuid_;
  if (fresh) known_.phase = Phase::unrecorded;
}

void Instance::tell(News news) {
  if (!running_) {
    // At rest its mailbox is empty: the news is absorbed at once, and the loop runs only for a step.
    auto self = shared_from_this();  // forgetting it must not end it while it answers
    if (take(news)) {
      running_ = true;
      spawn_detached(ctx_.io, run(std::move(self)), "instance " + uuid_);
    } else if (known_.forgettable()) {
      steps_.forget(uuid_);
    }
    return;
  }
  // A domain that starts while a step runs is that step's own doing (builds and starts are
  // toyvm's); a second round to look at it would cost every build a libvirt call.
  if (const auto* domain = std::get_if<news::DomainChanged>(&news); domain && domain->started) return;
  // News that ends what the running step does interrupts it now; it is absorbed after the step.
  if (image_wait_ && ends_work(known_, news)) image_wait_->cancel();
  if (sending_)
    if (auto why = ends_send(known_, news)) abort_sending(*why);
  inbox_.push_back(std::move(news));
}

bool Instance::being_removed() const {
  if (known_.cancelled()) return true;
  for (const News& news : inbox_)
    if (ends_work(known_, news)) return true;
  return false;
}

bool Instance::take(const News& news) {
  const Absorbed absorbed = absorb(known_, news, ctx_.host.provider);
  switch (absorbed) {
    case Absorbed::work_unreadable:
      // Unknown is not absent: the guest, its disk and its allocation stay as they are, and the
      // instance counts as listed, until a value this agent can read replaces it.
      spdlog::error("instance {}: its work cannot be read ({}); it is left as it is until it can", uuid_,
                    known_.work_error);
      break;
    case Absorbed::move_unreadable:
      spdlog::error("instance {}: its move cannot be read; it is left as it is until it can", uuid_);
      break;
    case Absorbed::address_found: spdlog::info("instance {}: address {}", uuid_, known_.address.ip); break;
    case Absorbed::address_overdue:
      spdlog::warn("instance {}: no address within address_timeout ({} s); no longer looking", uuid_,
                   in_seconds(ctx_.config.compute.address_timeout));
      break;
    case Absorbed::stale:
    case Absorbed::changed: break;
  }
  return step_due(absorbed);
}

// Started for a step that is due. `self` keeps the instance alive until its last step ends,
// even once it is forgotten.
awaitable<void> Instance::run([[maybe_unused]] std::shared_ptr<Instance> self) {
  bool due = true;
  while (!ctx_.stop.requested()) {
    for (; !inbox_.empty(); inbox_.pop_front()) due = take(inbox_.front()) || due;
    if (!due) break;
    result<Next> next = Next::later;
    try {
      next = co_await step();
    } catch (const std::exception& e) {
      // A step that threw is a failed step: retried, and the instance is never left stepping.
      next = Error(errc::cancelled, e.what());
    }
    if (!next) {
      // The one place a failed step is told of.
      if (next.error() == errc::changed) spdlog::info("instance {}: {}; will look again", uuid_, next.error().message());
      else spdlog::warn("instance {}: {}; will retry", uuid_, next.error().message());
      next = Next::later;
    }
    due = *next != Next::rest;
    if (*next == Next::later && inbox_.empty()) co_await ctx_.stop.sleep(retry_delay);
  }
  running_ = false;
  inbox_.clear();  // only when stopping: news left for an agent that is going away
  if (ctx_.address_wanted && address_search(std::chrono::steady_clock::now()) != AddressSearch::none)
    ctx_.address_wanted();
  if (known_.forgettable()) steps_.forget(uuid_);
}

Step Instance::step() {
  co_await failpoint::pass("reconcile.step");
  switch (next_step(known_)) {
    case InstanceStep::wait: co_return Next::rest;  // nothing is decided on what cannot be read
    case InstanceStep::recheck_work: co_return co_await recheck_work();
    case InstanceStep::remove_prepared: co_return co_await remove_prepared();
    case InstanceStep::move:
      if (auto moved = co_await step_move()) co_return std::move(*moved);
      if (known_.work && !known_.phase) co_return co_await load_recorded();
      co_return co_await reconcile();
    case InstanceStep::load_record: co_return co_await load_recorded();
    case InstanceStep::reconcile: co_return co_await reconcile();
  }
  co_return Next::rest;
}

Step Instance::reconcile() {
  auto actual = co_await ctx_.virt(&VirtBackend::state, uuid_);
  if (!actual) co_return actual.error().doing("libvirt");
  const CrashPolicy on_crash = ctx_.config.compute.on_guest_crash == "error" ? CrashPolicy::error : CrashPolicy::restart;
  const std::optional<WorkSpec>& desired = known_.work;
  // Why it is off matters only for a guest that should run and was running.
  StopCause cause = StopCause::unknown;
  if (*actual == DomainState::stopped && desired && desired->power == PowerState::running &&
      phase() == Phase::active) {
    auto why = co_await ctx_.virt(&VirtBackend::stop_cause, uuid_);
    if (why) cause = *why;
    if (cause == StopCause::crashed) spdlog::warn("instance {}: the guest crashed", uuid_);
    if (cause == StopCause::crashed && on_crash == CrashPolicy::restart)
      metrics::count("toyvm_guest_events_total", {{"outcome", "restarted"}});
  }
  const Desired power = desired ? Desired(desired->power) : std::nullopt;
  switch (decide(power, *actual, phase(), cause, on_crash)) {
    case ReconcileAction::none:
      // Its address (or that none came) is news this instance records itself, at rest.
      if (known_.address.unrecorded && phase() == Phase::active)
        co_return rest_after(co_await record_state(*desired, InstanceState::active));
      co_return Next::rest;
    case ReconcileAction::build: co_return co_await build(*desired);
    case ReconcileAction::start: co_return co_await power_on_off(*desired, true);
    case ReconcileAction::stop: co_return co_await power_on_off(*desired, false);
    case ReconcileAction::record_active:
      co_return rest_after(co_await record_state(*desired, InstanceState::active));
    case ReconcileAction::record_stopped:
      co_return rest_after(co_await record_state(*desired, InstanceState::stopped));
    case ReconcileAction::remove: co_return co_await remove(*desired);
    case ReconcileAction::release: co_return co_await release_held(*desired);
    case ReconcileAction::remove_domain:
      co_return rest_after(co_await remove_domain());
    case ReconcileAction::adopt_stop: co_return co_await adopt_stop(*desired, known_.work_revision);
    case ReconcileAction::record_crash: co_return co_await record_crash(*desired);
  }
  co_return Next::rest;
}

// Memory is empty after a restart, and an ERROR decided before it must stay ERROR.
Step Instance::load_recorded() {
  auto found = co_await steps_.recorder.read(uuid_);
  if (!found) co_return found.error().doing("reading its record");
  known_.phase = Phase::unrecorded;
  if (!*found) co_return Next::again;
  const InstanceRecord& record = **found;
  known_.phase = phase_of(record.state);
  if (record.state == InstanceState::error) known_.failure = record;
  if (record.state == InstanceState::active) {
    // Still looking when the last agent stopped: look for a full address_timeout again.
    look_for_address();
    known_.address.ip = record.ip;
    known_.address.given_up = record.no_address;
  }
  co_return Next::again;
}

InstanceRecord Instance::make_record(const WorkSpec& spec, InstanceState state) const {
  return steps_.recorder.make(spec, state, known_.address.ip, known_.address.given_up);
}

awaitable<result<void>> Instance::record(InstanceRecord record, std::vector<EtcdOp> also) {
  const InstanceState state = record.state;
  // Only an ERROR record is kept (to rewrite once released); any other is not copied.
  std::optional<InstanceRecord> failed;
  if (state == InstanceState::error) failed = record;
  auto written = co_await steps_.recorder.write(std::move(record), std::move(also));
  if (!written) co_return written;
  known_.phase = phase_of(state);
  known_.failure = std::move(failed);
  known_.address.unrecorded = false;  // every record carries the address as it is known
  co_return written;
}

// A guest that just became ACTIVE is looked for an address afresh.
awaitable<result<void>> Instance::record_state(const WorkSpec& spec, InstanceState state) {
  if (state == InstanceState::active && phase() != Phase::active) look_for_address();
  if (state != InstanceState::active) known_.address.ip.clear();
  co_return co_await record(make_record(spec, state));
}

// A guest that just started gets an address from DHCP: looked for until address_timeout.
void Instance::look_for_address() {
  known_.address.deadline = std::chrono::steady_clock::now() + ctx_.config.compute.address_timeout;
  known_.address.given_up = false;
}

Instance::AddressSearch Instance::address_search(std::chrono::steady_clock::time_point now) const {
  const auto& address = known_.address;
  if (!ctx_.has_nic() || !at_rest() || phase() != Phase::active || !address.ip.empty() || address.given_up)
    return AddressSearch::none;
  return now < address.deadline ? AddressSearch::looking : AddressSearch::overdue;
}

}  // namespace toyvm::compute
