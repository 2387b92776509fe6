#include "services/compute/guest_observer.hpp"

#include "core/dir_watch.hpp"
#include "model/projects.hpp"
#include "model/usage.hpp"

#include <boost/asio/as_tuple.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

namespace toyvm::compute {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

awaitable<void> GuestObserver::run() {
  auto console_every = ctx_.config.compute.console_interval;
  next_console_ = std::chrono::steady_clock::now();
  bool idle = false;
  while (!ctx_.stop.requested()) {
    if (!woken_) {
      // No address looked for and no console asked for: nothing is to be done until an instance
      // that comes to rest looking, or a request, wakes it (the ticks of 10,000 simulated hosts
      // were most of their idle agent's work).
      if (idle) {
        tick_.expires_at(asio::steady_timer::time_point::max());
      } else {
        tick_.expires_after(console_every.count() > 0 ? std::min<std::chrono::milliseconds>(500ms, console_every)
                                                      : 500ms);
      }
      if (!co_await ctx_.stop.wait(tick_)) break;
    }
    woken_ = false;
    auto now = std::chrono::steady_clock::now();
    std::vector<std::string> looking, consoles;
    std::vector<std::shared_ptr<Instance>> overdue;
    for (const auto& [uuid, instance] : instances_.all()) {
      if (!instance->at_rest()) continue;
      switch (instance->address_search(now)) {
        case Instance::AddressSearch::looking: looking.push_back(uuid); break;
        case Instance::AddressSearch::overdue: overdue.push_back(instance); break;
        case Instance::AddressSearch::none: break;
      }
      const Phase phase = instance->phase();
      if ((phase == Phase::active || phase == Phase::stopped) && console_requests_.count(uuid))
        consoles.push_back(uuid);
    }
    idle = looking.empty() && console_requests_.empty();
    for (const std::string& uuid : looking) co_await find_address(uuid);
    for (const auto& instance : overdue) instance->tell(news::AddressOverdue{});
    if (console_every.count() > 0 && now >= next_console_) {
      next_console_ = now + console_every;
      if (!consoles.empty()) co_await publish_consoles(std::move(consoles));
    }
  }
}

awaitable<void> GuestObserver::watch_leases() {
  // libvirt's networks on qemu:///system keep their leases there (<bridge>.status, rewritten
  // by its lease helper on each DHCP answer), which is what libvirt's address lookup reads.
  if (ctx_.config.compute.network.empty() || !ctx_.config.compute.bridge.empty()) co_return;
  co_await watch_directory("/var/lib/libvirt/dnsmasq", [this] { wake(); }, ctx_.stop);
}

void GuestObserver::wake() {
  woken_ = true;
  tick_.cancel();
}

awaitable<void> GuestObserver::find_address(std::string uuid) {
  auto found = co_await ctx_.virt(&VirtBackend::addresses, uuid);
  if (!found) {
    spdlog::debug("instance {}: its addresses: {}", uuid, found.error().message());
    co_return;
  }
  if (found->empty()) co_return;
  // The one on its own NIC when it has several.
  std::string ip = found->front().ip;
  const std::string mac = instance_mac(uuid);
  for (const GuestAddress& address : *found)
    if (address.mac == mac) ip = address.ip;
  // It may have gone meanwhile.
  if (auto instance = instances_.find(uuid)) instance->tell(news::AddressFound{std::move(ip)});
}

awaitable<void> GuestObserver::follow_console_requests() {
  const std::string prefix = ctx_.keys.console_requests_prefix(ctx_.host.provider);
  co_await follow_range(
      *ctx_.etcd, prefix, prefix_range_end(prefix),
      [this](const RangeResult& listing) {
        console_requests_.clear();
        for (const KeyValue& kv : listing.kvs) apply_request(kv, false);
      },
      [this](const WatchEvent& event) { apply_request(event.kv, event.type == WatchEvent::Type::erase); },
      [this] { return ctx_.stop.requested(); });
}

// A new asker gets the console at the next tick, even one that has not grown since it was
// last published: it has no copy yet.
void GuestObserver::apply_request(const KeyValue& kv, bool erased) {
  const std::string prefix = ctx_.keys.console_requests_prefix(ctx_.host.provider);
  if (!kv.key.starts_with(prefix)) return;
  const std::string_view rest = std::string_view(kv.key).substr(prefix.size());  // <instance>/<asker>
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos || slash + 1 == rest.size()) return;
  const std::string uuid(rest.substr(0, slash)), asker(rest.substr(slash + 1));
  if (erased) {
    auto asked = console_requests_.find(uuid);
    if (asked != console_requests_.end() && asked->second.erase(asker) && asked->second.empty()) {
      console_requests_.erase(asked);
      console_published_.erase(uuid);
    }
    return;
  }
  // Asked by the admin's show or the scheduler service, which write the instance's project.
  const std::string project = kv.value.empty() ? std::string(default_project) : kv.value;
  if (!is_project_name(project)) return;
  console_requests_[uuid][asker] = ConsoleAsker{kv.lease, project};
  console_published_.erase(uuid);  // the new asker has no copy yet
  next_console_ = std::chrono::steady_clock::now();
  wake();
}

// The last 16 KiB of each asked-for serial console that has grown (or an empty one for a
// guest that wrote none), put in etcd for each asker under its lease for `toyvm show --console`.
// One trip to the worker pool reads them all.
awaitable<void> GuestObserver::publish_consoles(std::vector<std::string> uuids) {
  struct Tail {
    std::string uuid;
    int64_t size = 0;
    std::string text;
  };
  std::vector<std::pair<std::string, int64_t>> logs;  // uuid, size last published (-1: none)
  for (const std::string& uuid : uuids) {
    auto published = console_published_.find(uuid);
    logs.emplace_back(uuid, published == console_published_.end() ? -1 : published->second);
  }
  auto read_tails = [dir = ctx_.host.instance_dir, logs = std::move(logs)] {
    std::vector<Tail> grown;
    for (const auto& [uuid, published] : logs) {
      const std::string path = console_log_path(dir, uuid);
      std::error_code ec;
      auto size = int64_t(fs::file_size(path, ec));
      if (ec) size = 0;
      if (size == published) continue;
      std::ifstream in(path, std::ios::binary);
      constexpr int64_t tail = 16 * 1024;
      in.seekg(std::max<int64_t>(0, size - tail));
      std::string text(size_t(std::min(size, tail)), '\0');
      in.read(text.data(), std::streamsize(text.size()));
      text.resize(size_t(in.gcount()));
      grown.push_back(Tail{uuid, size, std::move(text)});
    }
    return grown;
  };
  std::vector<Tail> grown = co_await run_blocking(ctx_.pool, std::move(read_tails));
  for (Tail& tail : grown) {
    std::vector<EtcdCompare> compare{EtcdCompare::present(ctx_.keys.work(ctx_.host.provider, tail.uuid))};
    auto asked = console_requests_.find(tail.uuid);
    if (asked == console_requests_.end()) continue;  // no longer asked for
    std::vector<EtcdOp> ops;
    std::set<std::string> askers;
    for (const auto& [asker, who] : asked->second) {
      ops.push_back(EtcdOp::put(ctx_.keys.console(who.project, tail.uuid, asker), tail.text, who.lease));
      askers.insert(asker);
    }
    auto put = co_await ctx_.etcd->txn(std::move(compare), std::move(ops));
    // An asker that came while it was put has no copy yet: left unmarked, the next tick puts it.
    auto now_asked = console_requests_.find(tail.uuid);
    if (!put || !put->succeeded || now_asked == console_requests_.end()) continue;
    const bool all_have_it = std::all_of(now_asked->second.begin(), now_asked->second.end(),
                                         [&](const auto& asker) { return askers.count(asker.first) > 0; });
    if (all_have_it) console_published_[tail.uuid] = tail.size;
  }
}

awaitable<void> GuestObserver::follow_usage_requests() {
  const std::string prefix = ctx_.keys.usage_requests_prefix(ctx_.host.provider);
  co_await follow_range(
      *ctx_.etcd, prefix, prefix_range_end(prefix),
      [this](const RangeResult& listing) {
        for (const KeyValue& kv : listing.kvs) take_usage_request(kv);
      },
      [this](const WatchEvent& event) {
        if (event.type == WatchEvent::Type::put) take_usage_request(event.kv);
      },
      [this] { return ctx_.stop.requested(); });
}

void GuestObserver::take_usage_request(const KeyValue& kv) {
  auto uuid = ctx_.keys.leaf(kv.key, ctx_.keys.usage_requests_prefix(ctx_.host.provider));
  auto instance = uuid ? instances_.find(*uuid) : nullptr;
  if (!instance || !instance->work()) return;  // not an instance of this host
  spawn_detached(ctx_.io, answer_usage(*uuid, kv.lease), "answering a usage request");
}

awaitable<void> GuestObserver::answer_usage(std::string uuid, int64_t lease) {
  auto first = co_await ctx_.virt(&VirtBackend::usage, uuid);
  if (!first) co_return;  // no domain (yet, or any more): the asker sees no answer
  auto first_at = std::chrono::steady_clock::now();
  DomainUsage last = *first;
  double window_s = 0;
  if (first->running) {
    asio::steady_timer timer(ctx_.io, 1s);
    co_await timer.async_wait(asio::as_tuple(use_awaitable));
    auto second = co_await ctx_.virt(&VirtBackend::usage, uuid);
    if (!second) co_return;
    last = *second;
    window_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - first_at).count();
  }
  InstanceUsage usage = usage_between(*first, last, window_s);
  usage.at = unix_millis();
  std::vector<EtcdCompare> here{EtcdCompare::present(ctx_.keys.work(ctx_.host.provider, uuid))};
  std::vector<EtcdOp> put{EtcdOp::put(ctx_.keys.usage(uuid), encode(usage), lease)};
  co_await ctx_.etcd->txn(std::move(here), std::move(put));  // a lease gone meanwhile: nobody is asking
}

}  // namespace toyvm::compute
