#include "services/compute/builder.hpp"

#include "model/groups.hpp"
#include "model/moves.hpp"

#include <spdlog/spdlog.h>

namespace toyvm::compute {

awaitable<Made> Builder::make_domain(WorkSpec spec, BuildCancel cancel) {
  using Outcome = Made::Outcome;
  BootImage image;
  if (!spec.image.empty()) {
    auto acquired = co_await acquire_image(spec, cancel.wake);
    if (!acquired) co_return Made(Outcome::cancelled);
    // An image failure of a build destroyed meanwhile is no failure: cancelled, below.
    if (!*acquired && !cancel.requested()) co_return Made(Outcome::failed, acquired->error());
    if (*acquired) image = **acquired;
  }
  if (cancel.requested()) co_return Made(Outcome::cancelled);
  auto created = co_await ctx_.virt(&VirtBackend::create, domain_spec(spec, image));
  if (created) co_return Made(Outcome::made);
  // libvirt unavailable: nothing wrong with the instance or this host's fit for it, so try
  // again, here. Otherwise the domain may be half-made; nothing of a failed build stays.
  if (created.error() == errc::virt_unavailable) co_return Made(Outcome::retry, created.error());
  co_await ctx_.virt(&VirtBackend::destroy, spec.uuid);
  co_return Made(Outcome::failed, created.error());
}

awaitable<result<DomainSpec>> Builder::incoming_domain(WorkSpec spec, std::string ip) {
  BootImage image;
  if (!spec.image.empty()) {
    asio::steady_timer never(ctx_.io, std::chrono::steady_clock::time_point::max());
    auto acquired = co_await acquire_image(spec, never);
    if (!acquired) co_return Error(errc::cancelled, "waiting for its image");
    if (!*acquired) co_return acquired->error();
    image = **acquired;
  }
  DomainSpec domain = domain_spec(spec, image);
  domain.ip = std::move(ip);
  co_return domain;
}

// Waits for the image (fetched once however many builds want it); nullopt when the build
// was cancelled meanwhile.
awaitable<std::optional<result<BootImage>>> Builder::acquire_image(WorkSpec spec, asio::steady_timer& wake) {
  auto acquired = co_await parts_.images.acquire(spec.image, spec.image_sha256, spec.image_format, wake);
  if (acquired && *acquired && !parts_.images.cache_path(spec.image).empty()) {
    std::set<std::string> in_use;
    for (const std::string& image : parts_.images_wanted()) in_use.insert(parts_.images.cache_path(image));
    auto trim = [images = &parts_.images, in_use = std::move(in_use)] {
      images->trim(in_use);
      return true;
    };
    co_await run_blocking(ctx_.pool, std::move(trim));
  }
  co_return acquired;
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

awaitable<result<void>> Builder::give_back(WorkSpec spec) {
  auto released = co_await ctx_.placement.release(spec.uuid);
  if (!released) co_return released.error().doing("releasing its allocation");
  if (!spec.group.empty()) {
    auto left = co_await ctx_.etcd->erase(ctx_.keys.group_member(spec.group, spec.uuid));
    if (!left) co_return left.error().doing("leaving its server group");
  }
  co_return result<void>{};
}

// Guarded by the revision of the work acted on, so a destroy or stop that lands meanwhile is
// never overwritten. Nothing is released before something else holds the instance.
awaitable<result<Relocated>> Builder::move_elsewhere(WorkSpec work, int64_t revision) {
  Relocation move;
  move.work = std::move(work);
  move.work.attempt += 1;
  move.from = ctx_.host.provider;
  move.work_revision = revision;
  move.deadline = std::chrono::steady_clock::now();  // one try: a failed step is retried as a whole
  InstanceRecord record = parts_.recorder.make(move.work, InstanceState::scheduled);
  co_return co_await parts_.placer.relocate(std::move(move), std::move(record));
}

// Only if its work is still here (a move that committed unseen, or a destroy, took the work away).
awaitable<result<void>> Builder::take_allocation_back(WorkSpec spec) {
  auto back = co_await parts_.placer.put_back(spec.uuid, ctx_.host.provider, spec.resources, std::nullopt);
  if (back == Relocated::Outcome::stranded)
    co_return Error(errc::not_ready, "its allocation cannot be taken back yet; it is tried again before building");
  co_return result<void>{};
}

awaitable<result<bool>> Builder::host_disabled() {
  // A disable the follower has not heard of yet came after the work reached this host (every
  // hand-over and move here is refused on a disabled host): the drain that made it finds the
  // instance here and moves it, as it would after a read an instant earlier.
  if (parts_.disabled_as_followed)
    if (std::optional<bool> followed = parts_.disabled_as_followed()) co_return *followed;
  auto disabled = co_await ctx_.etcd->range(ctx_.keys.disabled(ctx_.host.provider));
  if (!disabled) co_return disabled.error();
  co_return !disabled->kvs.empty();
}

awaitable<result<bool>> Builder::group_allows_here(WorkSpec spec) {
  const std::optional<GroupPolicy> policy = spec.group_policy;
  if (!policy) co_return true;
  const std::string prefix = ctx_.keys.group_prefix(spec.group);
  auto listed = co_await ctx_.etcd->range_prefix(prefix);
  if (!listed) co_return listed.error();
  std::vector<GroupMember> members;
  for (const KeyValue& kv : listed->kvs) {
    auto member = decode_group_member(kv.value);
    auto instance = ctx_.keys.leaf(kv.key, prefix);
    // mod_revision: a member that moved to another host counts from its move.
    if (member && instance) members.push_back(GroupMember{*instance, member->host, kv.mod_revision});
  }
  // Members on their way somewhere by a move count there too, from when the move was asked.
  auto moving = co_await ctx_.etcd->range_prefix(ctx_.keys.moves_prefix());
  if (!moving) co_return moving.error();
  for (const KeyValue& kv : moving->kvs) {
    auto move = decode_move(kv.value);
    if (!move || move->destination.empty() || move->state == MoveState::reverting) continue;
    for (GroupMember& member : members) {
      if (member.instance != move->instance) continue;
      member.heading = move->destination;
      member.heading_revision = kv.create_revision;
    }
  }
  co_return group_allows(*policy, members, spec.uuid, ctx_.host.provider);
}

}  // namespace toyvm::compute
