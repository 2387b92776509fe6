// toyvm audit: compares Placement (every consumer's allocations on every provider), etcd (work,
// instance records, server groups, live hosts) and the domains each live agent reports, and
// lists every way they disagree (model/audit.hpp). With --fix it repairs what is unambiguous,
// once the same discrepancy is seen again after a grace period, each release guarded by the
// consumer generation it last read. A schedule in flight claims before it hands over: its
// claims are held in etcd (a deadline it renews, or the scheduler service's lease) while it
// runs, and are not leaks; a hold past its deadline is its schedule's, gone.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "core/failpoint.hpp"
#include "model/audit.hpp"
#include "model/keys.hpp"
#include "services/common.hpp"
#include "services/services.hpp"

#include <boost/asio/steady_timer.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace toyvm {
namespace {

namespace json = boost::json;

class Auditor {
 public:
  Auditor(asio::io_context& io, const Config& config, const AuditOptions& options, Say& say)
      : io_(io),
        config_(config),
        options_(options),
        say_(say),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        placement_(io.get_executor(), config.placement) {}

  awaitable<Outcome> run() {
    auto snapshot = co_await take_snapshot();
    if (!snapshot) co_return snapshot.error();
    std::vector<Discrepancy> found = find_discrepancies(*snapshot);
    std::vector<bool> fixed(found.size(), false);
    const bool any_fixable = std::any_of(found.begin(), found.end(), [](const Discrepancy& d) { return fixable(d.kind); });
    if (options_.fix && any_fixable) {
      asio::steady_timer grace(io_, options_.grace);
      co_await grace.async_wait(use_awaitable);
      auto again = co_await take_snapshot();
      if (!again) co_return again.error();
      std::vector<Discrepancy> still = find_discrepancies(*again);
      fixed.assign(still.size(), false);
      co_await failpoint::pass("audit.fix");  // looked twice, not yet fixed
      for (size_t i = 0; i < still.size(); ++i) {
        const bool seen_before = std::find(found.begin(), found.end(), still[i]) != found.end();
        if (!seen_before || !fixable(still[i].kind)) continue;
        auto repaired = co_await fix(still[i], *again);
        if (!repaired) spdlog::warn("not fixing {}: {}", still[i].instance, repaired.error().message());
        fixed[i] = bool(repaired);
      }
      found = std::move(still);
      snapshot = std::move(again);
    }
    report(found, fixed, *snapshot);
    for (size_t i = 0; i < found.size(); ++i)
      if (!fixed[i]) co_return ExitCode::discrepancies;
    co_return ExitCode::ok;
  }

 private:
  // The allocations on providers first, first + step, ... until one is not read.
  awaitable<void> read_allocations(const std::vector<std::string>& providers, size_t first, size_t step,
                                   AuditSnapshot& s, std::optional<Error>& unread) {
    for (size_t i = first; i < providers.size() && !unread; i += step) {
      auto held = co_await placement_.provider_allocations(providers[i]);
      if (!held) {
        unread = held.error();
        co_return;
      }
      for (auto& [consumer, amounts] : *held) s.allocations[consumer][providers[i]] = amounts;
    }
  }

  // Placement first, then etcd in one transaction (one revision).
  awaitable<result<AuditSnapshot>> take_snapshot() {
    AuditSnapshot s;
    auto providers = co_await placement_.providers(config_.placement.provider_trait);
    if (!providers) co_return providers.error();
    s.providers.insert(providers->begin(), providers->end());
    // A request per provider, ten thousand of them at 10,000 hosts: eight at a time.
    constexpr size_t readers = 8;
    std::optional<Error> unread;
    std::vector<awaitable<void>> reading;
    for (size_t first = 0; first < readers; ++first)
      reading.push_back(read_allocations(*providers, first, readers, s, unread));
    co_await run_together(std::move(reading));
    if (unread) co_return *unread;
    std::vector<EtcdOp> reads;
    for (const std::string& prefix : {keys_.hosts_prefix(), keys_.work_root(), keys_.instances_prefix(), keys_.groups_root(),
                                      keys_.domains_root(), keys_.claims_prefix(), keys_.moves_prefix(),
                                      keys_.holds_prefix()})
      reads.push_back(EtcdOp::get(prefix, prefix_range_end(prefix)));
    auto txn = co_await etcd_->txn({}, std::move(reads));
    if (!txn) co_return etcd_error(*etcd_, txn.error());
    for (const KeyValue& kv : txn->ranges[0].kvs)
      if (auto host = decode_host(kv.value)) s.live_hosts.insert(host->provider);
    for (const KeyValue& kv : txn->ranges[1].kvs) {
      auto key = keys_.parse_work(kv.key);
      if (!key) continue;
      s.work_host[key->instance] = key->host;
      auto spec = decode_work(kv.value);
      if (!spec) s.unreadable.push_back({key->instance, kv.key, spec.error().message()});
      else if (spec->uuid != key->instance)
        s.unreadable.push_back({key->instance, kv.key, "its uuid is not its key's"});
    }
    const std::string records_root = keys_.instances_prefix();
    for (const KeyValue& kv : txn->ranges[2].kvs) {
      if (auto record = decode_instance(kv.value))
        s.instances[record->uuid] = std::move(*record);
      else
        s.unreadable.push_back({kv.key.substr(records_root.size()), kv.key, record.error().message()});
    }
    for (const KeyValue& kv : txn->ranges[3].kvs)
      if (auto member = keys_.parse_group_member(kv.key)) s.group_members[member->instance] = member->group;
    for (const KeyValue& kv : txn->ranges[4].kvs)
      if (auto key = keys_.parse_domain(kv.key)) s.domains[key->host].insert(key->instance);
    s.now_ms = unix_millis();
    std::map<std::string, KeyRead> claims, holds;
    for (const KeyValue& kv : txn->ranges[5].kvs)
      if (auto uuid = keys_.leaf(kv.key, keys_.claims_prefix())) claims[*uuid] = KeyRead{kv.value, kv.mod_revision};
    for (const KeyValue& kv : txn->ranges[7].kvs)
      if (auto first = keys_.leaf(kv.key, keys_.holds_prefix())) holds[*first] = KeyRead{kv.value, kv.mod_revision};
    sort_holds(s, claims, holds);
    s.move_deadline_ms = std::chrono::duration_cast<std::chrono::milliseconds>(options_.move_deadline).count();
    for (const KeyValue& kv : txn->ranges[6].kvs) {
      auto move = decode_move(kv.value);
      if (move) {
        s.moves[move->instance] = std::move(*move);
      } else {
        s.moves_unreadable = true;
        s.unreadable.push_back({kv.key.substr(keys_.moves_prefix().size()), kv.key, move.error().message()});
      }
    }
    // Whose each consumer without an instance is (only toyvm's own are judged), and, with
    // --fix, the generation of those a fix may release.
    s.own_project = config_.placement.consumer_project;
    for (auto& [consumer, allocations] : s.allocations) {
      auto record = s.instances.find(consumer);
      const bool error = options_.fix && record != s.instances.end() && record->second.state == InstanceState::error;
      if (allocations.empty() || (!error && (record != s.instances.end() || s.work_host.count(consumer)))) continue;
      auto held = co_await placement_.consumer_allocations(consumer);
      if (!held) co_return held.error();
      s.consumers[consumer] = std::move(*held);
    }
    co_return s;
  }

  awaitable<result<void>> fix(const Discrepancy& d, const AuditSnapshot& s) {
    if (d.kind == AuditKind::member_without_instance) {
      auto group = s.group_members.find(d.instance);
      if (group == s.group_members.end()) co_return Error(errc::changed, "its group membership is gone");
      auto erased = co_await etcd_->erase(keys_.group_member(group->second, d.instance));
      if (!erased) co_return erased.error();
      co_return result<void>{};
    }
    if (d.kind == AuditKind::schedule_hold_lapsed) {
      auto hold = s.lapsed_schedule_holds.find(d.instance);
      if (hold == s.lapsed_schedule_holds.end()) co_return Error(errc::changed, "the hold is gone");
      std::string key = keys_.hold(d.instance);
      std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(key, hold->second)};
      co_return co_await erase_as_read(std::move(as_read), std::move(key));
    }
    // A lapsed hold goes first, only as it was read: a schedule that renewed it lives on, and
    // one that hands over later finds its claim gone and gives its claims back.
    if (auto lapsed = s.lapsed_holds.find(d.instance); lapsed != s.lapsed_holds.end()) {
      const LapsedHold& hold = lapsed->second;
      std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(keys_.claim(d.instance), hold.claim_revision)};
      if (hold.hold)
        as_read.push_back(hold.hold_revision != 0 ? EtcdCompare::mod_revision_is(keys_.hold(*hold.hold), hold.hold_revision)
                                                  : EtcdCompare::absent(keys_.hold(*hold.hold)));
      std::string key = keys_.claim(d.instance);
      auto erased = co_await erase_as_read(std::move(as_read), std::move(key));
      if (!erased) co_return erased.error();
    }
    if (d.kind == AuditKind::hold_lapsed) co_return result<void>{};
    // Nothing of it is owed to anyone, as of the second look: released only if it still holds
    // what it held then (an empty PUT under that consumer generation).
    auto read = s.consumers.find(d.instance);
    if (read == s.consumers.end() || !read->second.generation) co_return Error(errc::changed, "its allocation is gone");
    Allocations none;
    co_return co_await placement_.replace(d.instance, std::move(none), *read->second.generation, read->second.owner);
  }

  awaitable<result<void>> erase_as_read(std::vector<EtcdCompare> as_read, std::string key) {
    std::vector<EtcdOp> erase{EtcdOp::erase(std::move(key))};
    auto erased = co_await etcd_->txn(std::move(as_read), std::move(erase));
    if (!erased) co_return erased.error();
    if (!erased->succeeded) co_return Error(errc::changed, "its schedule's hold was renewed or taken");
    co_return result<void>{};
  }

  void report(const std::vector<Discrepancy>& found, const std::vector<bool>& fixed, const AuditSnapshot& s) {
    if (options_.json) {
      json::array items;
      for (size_t i = 0; i < found.size(); ++i)
        items.push_back(json::object{{"kind", to_string(found[i].kind)}, {"instance", found[i].instance},
                                     {"provider", found[i].provider}, {"detail", found[i].detail},
                                     {"fixed", bool(fixed[i])}});
      json::object out{{"discrepancies", std::move(items)},
                       {"instances", s.work_host.size()},
                       {"consumers", s.allocations.size()},
                       {"live_hosts", s.live_hosts.size()}};
      say_.line(json::serialize(out));
      return;
    }
    if (found.empty()) {
      say_.line(fmt::format("clean: Placement, etcd and the hosts' domains agree ({} instances, {} live hosts)",
                            s.work_host.size(), s.live_hosts.size()));
      return;
    }
    say_.line(fmt::format("{:<28}  {:<36}  {:<36}  {}", "KIND", "INSTANCE", "PROVIDER", "DETAIL"));
    size_t repaired = 0;
    for (size_t i = 0; i < found.size(); ++i) {
      repaired += fixed[i];
      say_.line(fmt::format("{:<28}  {:<36}  {:<36}  {}{}", to_string(found[i].kind), found[i].instance,
                            found[i].provider.empty() ? "-" : found[i].provider, found[i].detail,
                            fixed[i] ? " (fixed)" : ""));
    }
    say_.line(fmt::format("{} discrepancies, {} fixed", found.size(), repaired));
  }

  asio::io_context& io_;
  const Config& config_;
  const AuditOptions& options_;
  Say& say_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  PlacementClient placement_;
};

}  // namespace

Outcome run_audit(const Config& config, const AuditOptions& options, Say& say) {
  return run_on_loop([&](asio::io_context& io) -> awaitable<Outcome> {
    Auditor auditor(io, config, options, say);
    co_return co_await auditor.run();
  });
}

}  // namespace toyvm
