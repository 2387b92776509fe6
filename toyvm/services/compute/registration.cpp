#include "services/compute/registration.hpp"

#include "model/uuid.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <utility>

namespace toyvm::compute {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

result<std::string> load_or_create_provider_uuid(const fs::path& state_dir, bool* made) {
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  fs::path file = state_dir / "provider_uuid";
  std::ifstream in(file);
  std::string uuid;
  if (in >> uuid) {
    if (is_uuid(uuid)) return uuid;
    return Error(errc::invalid_config, fmt::format("{} does not hold a uuid; remove it to register a new provider", file.string()));
  }
  uuid = new_uuid();
  fs::path tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp);
    out << uuid << '\n';
    if (!out.flush()) {
      return Error(errc::invalid_config, fmt::format("cannot write {}", tmp.string()));
    }
  }
  fs::rename(tmp, file, ec);
  if (ec) {
    return Error(errc::invalid_config, fmt::format("cannot write {}: {}", file.string(), ec.message()));
  }
  if (made) *made = true;
  return uuid;
}

awaitable<void> adopt_provider_by_name(Placement& placement, EtcdClient& etcd, KeyLayout keys, StopSignal& stop,
                                       fs::path state_dir, std::string name) {
  std::error_code ec;
  if (fs::exists(state_dir / "provider_uuid", ec)) co_return;
  Backoff backoff;
  for (; !stop.requested(); co_await backoff.wait()) {
    auto found = co_await placement.provider_named(name);
    if (found && !*found) co_return;  // a new host: a new provider
    if (!found) {
      spdlog::warn("looking up provider {} in Placement: {}; retrying", name, found.error().message());
      continue;
    }
    auto alive = co_await etcd.range(keys.host(**found));
    if (!alive) {
      spdlog::warn("looking up provider {} in etcd: {}; retrying", **found, alive.error().message());
      continue;
    }
    if (!alive->kvs.empty()) {
      // This host's own record until its lease runs out, or another agent of this name:
      // two agents must never share a provider.
      spdlog::warn("provider {} ({}) has a live agent; waiting for its lease to end (another agent with this "
                   "name? give this one another --name)", **found, name);
      continue;
    }
    fs::create_directories(state_dir, ec);
    fs::path tmp = state_dir / "provider_uuid.tmp";
    std::ofstream(tmp) << **found << '\n';
    fs::rename(tmp, state_dir / "provider_uuid", ec);
    spdlog::warn("no provider uuid in {}: this host is provider {} ({}) in Placement; taking it again",
                 state_dir.string(), **found, name);
    co_return;
  }
}

awaitable<void> ProviderRegistration::register_until_done() {
  Backoff backoff;
  while (!ctx_.stop.requested()) {
    auto registered = co_await register_once();
    if (registered) break;
    spdlog::warn("registering provider {} in Placement: {}; retrying", ctx_.host.provider,
                 registered.error().message());
    co_await backoff.wait();
  }
  spdlog::info("registered provider {} with inventory {}", ctx_.host.provider,
               format_amounts(capacity_of(inventory_)));
  registered_ = true;
  set_operator_disabled(operator_disabled_);  // a disable that came while registering
}

// The provider, its inventory, traits and zone, each call idempotent.
awaitable<result<void>> ProviderRegistration::register_once() {
  Placement& placement = ctx_.placement;
  const std::string& provider = ctx_.host.provider;
  auto created = co_await placement.ensure_provider(provider, ctx_.host.name, ctx_.host.new_provider);
  if (!created) co_return created;
  auto inventory = co_await placement.set_inventory(provider, inventory_);
  if (!inventory) co_return inventory;
  traits_ = ctx_.config.compute.traits;
  traits_.push_back(ctx_.config.placement.provider_trait);  // schedules and audit know toyvm's by it
  if (const int shards = ctx_.config.placement.shards; shards > 1)
    traits_.push_back(shard_trait(shard_of(provider, shards)));
  if (!cpu_traits_.empty()) {
    // Only the CPU traits this Placement knows: an unknown standard trait is refused.
    auto known = co_await placement.known_traits("HW_CPU_X86_");
    if (!known) co_return known.error();
    for (const std::string& trait : cpu_traits_)
      if (std::find(known->begin(), known->end(), trait) != known->end()) traits_.push_back(trait);
  }
  const bool disabled = operator_disabled_;
  std::vector<std::string> traits = traits_with_status(disabled);
  auto traits_set = co_await placement.set_traits(provider, std::move(traits));
  if (!traits_set) co_return traits_set;
  disabled_in_placement_ = disabled;
  std::vector<std::string> aggregates;
  if (!ctx_.config.compute.availability_zone.empty())
    aggregates.push_back(availability_zone_aggregate(ctx_.config.compute.availability_zone));
  // A provider made just now is in no aggregate: one request fewer for each of a cloud's hosts.
  if (aggregates.empty() && ctx_.host.new_provider) co_return result<void>{};
  co_return co_await placement.set_aggregates(provider, std::move(aggregates));
}

std::vector<std::string> ProviderRegistration::traits_with_status(bool disabled) const {
  std::vector<std::string> traits = traits_;
  if (disabled) traits.emplace_back(disabled_trait);
  return traits;
}

awaitable<void> ProviderRegistration::mark_disabled() {
  // Named, not a temporary in the co_await: GCC 12 mishandles those in a condition.
  std::vector<std::string> traits = traits_with_status(true);
  auto marked = co_await ctx_.placement.set_traits(ctx_.host.provider, std::move(traits));
  if (!marked)
    spdlog::warn("could not mark provider {} disabled: {}", ctx_.host.provider, marked.error().message());
}

void ProviderRegistration::set_operator_disabled(bool disabled) {
  operator_disabled_ = disabled;
  // Before registering, registering sets the traits; a running update loops until they agree.
  if (!registered_ || updating_ || disabled_in_placement_ == disabled) return;
  updating_ = true;
  spawn_detached(ctx_.io, update_status(), "updating the provider's status");
}

awaitable<void> ProviderRegistration::update_status() {
  Backoff backoff;
  while (!ctx_.stop.requested() && disabled_in_placement_ != operator_disabled_) {
    const bool disabled = operator_disabled_;
    std::vector<std::string> traits = traits_with_status(disabled);
    auto updated = co_await ctx_.placement.set_traits(ctx_.host.provider, std::move(traits));
    if (updated) {
      disabled_in_placement_ = disabled;
      backoff.reset();
      continue;
    }
    spdlog::warn("setting provider {} {} in Placement: {}; retrying", ctx_.host.provider,
                 disabled ? "disabled" : "enabled", updated.error().message());
    co_await backoff.wait();
  }
  updating_ = false;
}

awaitable<void> HostMaintenanceFollower::load() {
  Backoff backoff;
  const std::string key = ctx_.keys.disabled(ctx_.host.provider);
  while (!ctx_.stop.requested()) {
    auto found = co_await ctx_.etcd->range(key);
    if (found) {
      apply(found->kvs.empty() ? nullptr : &found->kvs.front());
      loaded_revision_ = found->revision;
      co_return;
    }
    spdlog::warn("reading {} in etcd: {}; retrying", key, found.error().message());
    co_await backoff.wait();
  }
}

awaitable<void> HostMaintenanceFollower::follow() {
  const std::string key = ctx_.keys.disabled(ctx_.host.provider);
  co_await follow_range(
      *ctx_.etcd, key, std::string(),
      [this](const RangeResult& listing) { apply(listing.kvs.empty() ? nullptr : &listing.kvs.front()); },
      [this](const WatchEvent& event) { apply(event.type == WatchEvent::Type::erase ? nullptr : &event.kv); },
      [this] { return ctx_.stop.requested(); }, std::exchange(loaded_revision_, 0));
}

void HostMaintenanceFollower::apply(const KeyValue* kv) {
  std::optional<HostMaintenance> maintenance;
  if (kv) {
    // A value that does not decode still says an operator wants the host out of service.
    auto decoded = decode_maintenance(kv->value);
    maintenance = decoded ? *decoded : HostMaintenance{"(unreadable: " + decoded.error().message() + ")", 0};
  }
  heard_ = true;
  if (maintenance == current_) return;
  if (maintenance)
    spdlog::info("disabled by an operator{}{}", maintenance->reason.empty() ? "" : ": ", maintenance->reason);
  else if (current_)
    spdlog::info("enabled by an operator");
  current_ = maintenance;
  presence_.set_maintenance(maintenance);
  presence_.publish();
  registration_.set_operator_disabled(maintenance.has_value());
}

}  // namespace toyvm::compute
