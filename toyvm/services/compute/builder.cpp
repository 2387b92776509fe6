#include "services/compute/builder.hpp"

#include "core/failpoint.hpp"
#include "core/metrics.hpp"
#include "model/groups.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace toyvm::compute {

using namespace asio::experimental::awaitable_operators;
using namespace std::chrono_literals;

// How long a build goes before its record says BUILDING.
constexpr auto building_shown_after = 100ms;

awaitable<bool> Builder::build(WorkSpec spec) {
  if (parts_.slots[spec.uuid].allocation_elsewhere) {
    if (!co_await take_allocation_back(spec)) co_return false;
    parts_.slots[spec.uuid].allocation_elsewhere = false;
  }
  int limit = ctx_.config.compute.max_instances;
  if (limit > 0 && parts_.presence.instance_count() > size_t(limit))
    co_return co_await fail(spec, "full_cn", fmt::format("host {} is full ({} instances)", ctx_.host.name, limit));
  if (!spec.group.empty()) {
    auto allowed = co_await group_allows_here(spec);
    if (!allowed) co_return false;
    if (!*allowed)
      co_return co_await fail(spec, "no_valid_host",
                              fmt::format("server group {} ({}) does not allow this host", spec.group,
                                          spec.group_policy ? to_string(*spec.group_policy) : "no policy"));
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
    co_return false;
  }
  switch (made.outcome) {
    case Made::Outcome::cancelled: co_return true;  // destroyed meanwhile: the next round removes what there is
    case Made::Outcome::retry:
      spdlog::warn("instance {}: {}; will retry", spec.uuid, made.message);
      co_return false;
    case Made::Outcome::failed:
      parts_.presence.publish(spec.uuid);
      metrics::count("toyvm_builds_total", {{"result", "failed"}});
      co_return co_await fail(spec, made.reason, made.message);
    case Made::Outcome::made: break;
  }
  // Work that should be off (an evacuated STOPPED instance) is made and left off.
  const bool running = spec.power == PowerState::running;
  using Written = InstanceRecorder::Written;
  // The domain's key rides in the same transaction: one commit for a build, not two.
  std::vector<EtcdOp> domain_key;
  if (auto op = parts_.presence.domain_put(spec.uuid)) domain_key.push_back(std::move(*op));
  const Written written =
      co_await parts_.recorder.record_made(spec, running ? InstanceState::active : InstanceState::stopped, domain_key);
  // The work left this host: nothing made for it stays. An unanswered write may have been
  // made, so the domain stays and the next round records it again.
  if (written == Written::work_gone) co_await ctx_.virt(&VirtBackend::destroy, spec.uuid);
  if (written == Written::made && !domain_key.empty())
    parts_.presence.recorded(spec.uuid, domain_key.front());
  else
    parts_.presence.publish(spec.uuid);
  if (written != Written::made) co_return false;
  spdlog::info("instance {}: {}", spec.uuid, running ? "active" : "made, and stopped as its work says");
  metrics::count("toyvm_builds_total", {{"result", "active"}});
  metrics::observe("toyvm_build_seconds",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  co_return true;
}

// BUILDING, once `patience` expires before the domain is made; nullopt when it was made (or
// failed) in time and there is nothing to say yet.
awaitable<std::optional<bool>> Builder::record_building_if_slow(WorkSpec spec, asio::steady_timer& patience) {
  auto [ec] = co_await patience.async_wait(asio::as_tuple(use_awaitable));
  if (ec) co_return std::nullopt;
  co_return co_await parts_.recorder.record(std::move(spec), InstanceState::building);
}

awaitable<Builder::Made> Builder::make_domain_in_time(WorkSpec spec, asio::steady_timer& patience) {
  Made made = co_await make_domain(std::move(spec));
  patience.cancel();
  co_return made;
}

awaitable<Builder::Made> Builder::make_domain(WorkSpec spec) {
  using Outcome = Made::Outcome;
  BootImage image;
  if (!spec.image.empty()) {
    auto acquired = co_await acquire_image(spec);
    if (!acquired) co_return Made(Outcome::cancelled);
    // An image failure of a build destroyed meanwhile is no failure: cancelled, below.
    if (!*acquired && !parts_.slots[spec.uuid].cancelled())
      co_return Made(Outcome::failed, acquired->failure->reason, acquired->failure->message);
    image = acquired->value;
  }
  if (parts_.slots[spec.uuid].cancelled()) co_return Made(Outcome::cancelled);
  auto created = co_await ctx_.virt(&VirtBackend::create, domain_spec(spec, image));
  if (created) co_return Made(Outcome::made);
  // libvirt unavailable: nothing wrong with the instance or this host's fit for it, so try
  // again, here. Otherwise the domain may be half-made; nothing of a failed build stays.
  if (created.failure->reason == "libvirt_unavailable")
    co_return Made(Outcome::retry, created.failure->reason, created.failure->message);
  co_await ctx_.virt(&VirtBackend::destroy, spec.uuid);
  co_return Made(Outcome::failed, created.failure->reason, created.failure->message);
}

// Waits for the image (fetched once however many builds want it); nullopt when the build
// was cancelled meanwhile.
awaitable<std::optional<VirtResult<BootImage>>> Builder::acquire_image(WorkSpec spec) {
  asio::steady_timer wake(ctx_.io, std::chrono::steady_clock::time_point::max());
  parts_.slots[spec.uuid].waiting = &wake;
  auto acquired = co_await parts_.images.acquire(spec.image, spec.image_sha256, spec.image_format, wake);
  parts_.slots[spec.uuid].waiting = nullptr;
  if (acquired && *acquired && !parts_.images.cache_path(spec.image).empty()) {
    auto trim = [images = &parts_.images, in_use = images_in_use()] {
      images->trim(in_use);
      return true;
    };
    co_await run_blocking(ctx_.pool, std::move(trim));
  }
  co_return acquired;
}

std::set<std::string> Builder::images_in_use() const {
  std::set<std::string> paths;
  for (auto& [uuid, slot] : parts_.slots)
    if (slot.desired) paths.insert(parts_.images.cache_path(slot.desired->image));
  return paths;
}

DomainSpec Builder::domain_spec(const WorkSpec& spec, const BootImage& image) const {
  DomainSpec d;
  d.uuid = spec.uuid;
  d.name = spec.name.empty() ? spec.uuid : spec.name;
  auto amount = [&](const char* rc, int64_t fallback) {
    auto it = spec.resources.find(rc);
    return it == spec.resources.end() ? fallback : it->second;
  };
  d.vcpus = amount("VCPU", 1);
  d.memory_mb = amount("MEMORY_MB", 128);
  d.disk_gb = amount("DISK_GB", 0);
  d.image = image;
  d.mac = instance_mac(spec.uuid);  // the NIC itself only with a network or bridge
  d.start = spec.power == PowerState::running;
  // Its address is not known yet: the guest takes it by DHCP, as its network data says.
  if (spec.config_drive || ctx_.config.compute.config_drive) d.config_drive = config_drive_files(ctx_.describe_guest(spec, ""));
  return d;
}

// ERROR with a reason code; the allocation and the group membership are given back.
// A build that failed here may succeed elsewhere (Nova's alternates): the instance moves
// to another live host while attempts remain; after the last it is ERROR no_valid_host.
// A bad image is bad everywhere: image_failure is final at once (Nova's BuildAbort).
awaitable<bool> Builder::fail(WorkSpec spec, std::string reason, std::string message) {
  spdlog::error("instance {}: {}: {}", spec.uuid, reason, message);
  if (reason != "image_failure") {
    if (spec.attempt < ctx_.config.compute.max_build_attempts) {
      auto moved = co_await move_elsewhere(spec);
      if (moved && *moved) co_return true;
      if (!moved) co_return false;  // a server did not answer: the whole step is retried
    }
    message = fmt::format("no host could build it in {} attempt(s); the last said {}: {}", spec.attempt, reason,
                          message);
    reason = "no_valid_host";
  }
  // ERROR first, as releasing: from then on every round (and every restart) releases until
  // it is done, and only then says that the instance holds nothing.
  InstanceRecord failed = parts_.recorder.make(spec, InstanceState::error);
  failed.error_code = std::move(reason);
  failed.error_message = std::move(message);
  failed.releasing = true;
  if (!co_await parts_.recorder.write(failed)) co_return false;
  metrics::count("toyvm_instance_failures_total", {{"reason", failed.error_code}});
  co_return co_await release_held(spec);
}

awaitable<bool> Builder::release_held(WorkSpec spec) {
  auto released = co_await ctx_.placement.release(spec.uuid);
  if (!released) {
    spdlog::warn("instance {}: releasing its allocation: {}; will retry", spec.uuid,
                 ctx_.placement.last_error().detail);
    co_return false;
  }
  if (!spec.group.empty() && !co_await ctx_.etcd->erase(ctx_.keys.group_member(spec.group, spec.uuid)))
    co_return false;
  if (const auto& failure = parts_.slots[spec.uuid].failure; failure && failure->releasing) {
    InstanceRecord done = *failure;
    done.releasing = false;
    done.updated_at = unix_millis();
    if (!co_await parts_.recorder.write(std::move(done))) co_return false;
  }
  parts_.slots[spec.uuid].released = true;
  spdlog::info("instance {}: ERROR; its allocation is released", spec.uuid);
  co_return true;
}

// Moves the instance to another live host (Placer::relocate), guarded by the revision of the
// work acted on, so a destroy or stop that lands meanwhile is never overwritten. Nothing is
// released before something else holds the instance. true: moved; false: no other host
// fits; an error: it changed meanwhile, or Placement or etcd did not answer (the step is
// retried).
awaitable<result<bool>> Builder::move_elsewhere(WorkSpec spec) {
  const InstanceSlot& slot = parts_.slots[spec.uuid];
  if (slot.cancelled()) co_return true;  // destroyed meanwhile: removing it releases what it holds
  Relocation move;
  move.work = *slot.desired;
  move.work.attempt = spec.attempt + 1;
  move.record = parts_.recorder.make(move.work, InstanceState::scheduled);
  move.from = ctx_.host.provider;
  move.work_revision = slot.revision;
  move.deadline = std::chrono::steady_clock::now();  // one try: a failed step is retried as a whole
  auto moved = co_await parts_.placer.relocate(std::move(move));
  if (!moved) co_return result<bool>(boost::system::in_place_error, moved.error());
  switch (moved->outcome) {
    case Relocated::Outcome::moved:
      spdlog::info("instance {}: moved to host {} for attempt {}", spec.uuid, moved->host, spec.attempt + 1);
      co_return true;
    case Relocated::Outcome::no_room:
      co_return false;
    case Relocated::Outcome::stranded:  // taken back before it builds here again
      parts_.slots[spec.uuid].allocation_elsewhere = true;
      break;
    case Relocated::Outcome::lost_race:
    case Relocated::Outcome::put_back:
      break;
  }
  if (moved->unknown) co_return result<bool>(boost::system::in_place_error, moved->unknown);
  co_return result<bool>(boost::system::in_place_error, make_error_code(errc::cancelled));
}

// After a move that did not happen, the instance's allocation comes back to this host, from
// wherever it is, if its work is still here (a move that committed unseen, or a destroy,
// took the work away).
awaitable<bool> Builder::take_allocation_back(WorkSpec spec) {
  auto back = co_await parts_.placer.put_back(spec.uuid, ctx_.host.provider, spec.resources, std::nullopt);
  if (back != Relocated::Outcome::stranded) co_return true;
  spdlog::warn("instance {}: cannot take its allocation back yet; will try again before building", spec.uuid);
  co_return false;
}

// Nova's late check: concurrent schedules may have put members of a hard group against
// its policy; the member created later gives way.
awaitable<result<bool>> Builder::group_allows_here(WorkSpec spec) {
  const std::optional<GroupPolicy> policy = spec.group_policy;
  if (!policy) co_return true;
  const std::string prefix = ctx_.keys.group_prefix(spec.group);
  auto listed = co_await ctx_.etcd->range_prefix(prefix);
  if (!listed) co_return result<bool>(boost::system::in_place_error, listed.error());
  std::vector<GroupMember> members;
  for (const KeyValue& kv : listed->kvs) {
    auto member = decode_group_member(kv.value);
    auto instance = ctx_.keys.leaf(kv.key, prefix);
    // mod_revision: a member that moved to another host counts from its move.
    if (member && instance) members.push_back(GroupMember{*instance, member->host, kv.mod_revision});
  }
  co_return group_allows(*policy, members, spec.uuid, ctx_.host.provider);
}

}  // namespace toyvm::compute
