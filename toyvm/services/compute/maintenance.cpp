#include "services/compute/maintenance.hpp"

#include <spdlog/spdlog.h>

namespace toyvm::compute {

using namespace std::chrono_literals;

awaitable<void> HostMaintenanceFollower::load() {
  Backoff backoff;
  const std::string key = ctx_.keys.disabled(ctx_.host.provider);
  while (!ctx_.stop.requested()) {
    auto found = co_await ctx_.etcd->range(key);
    if (found) {
      apply(found->kvs.empty() ? nullptr : &found->kvs.front());
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
      [this] { return ctx_.stop.requested(); });
}

void HostMaintenanceFollower::apply(const KeyValue* kv) {
  std::optional<HostMaintenance> maintenance;
  if (kv) {
    // A value that does not decode still says an operator wants the host out of service.
    auto decoded = decode_maintenance(kv->value);
    maintenance = decoded ? *decoded : HostMaintenance{"(unreadable: " + decoded.error().message() + ")", 0};
  }
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
