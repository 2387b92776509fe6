// toyvm show, stop, start and destroy: read and change instances through etcd only. The
// compute agent that owns an instance does the work: powering it, destroying it, releasing
// its allocation.

#include "clients/etcd.hpp"
#include "core/failpoint.hpp"
#include "clients/placement.hpp"
#include "model/console.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"
#include "services/common.hpp"
#include "services/services.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <spdlog/spdlog.h>

#include <ctime>
#include <map>
#include <set>
#include <variant>

namespace toyvm {
namespace {

namespace json = boost::json;

std::string amounts_text(const ResourceAmounts& amounts) {
  return amounts.empty() ? "-" : format_amounts(amounts);
}

json::object instance_json(const InstanceRecord& r) {
  json::object o{{"uuid", r.uuid}, {"name", r.name}, {"state", to_string(r.state)},
                 {"host", r.host}, {"ip", r.ip},     {"mac", r.mac}};
  if (r.error_code.empty()) {
    o["error"] = nullptr;
  } else {
    o["error"] = json::object{{"code", r.error_code}, {"message", r.error_message}};
  }
  if (r.no_address) o["no_address"] = true;
  if (r.releasing) o["releasing"] = true;
  o["updated_at"] = r.updated_at;
  return o;
}

void print_usage(const InstanceUsage& u) {
  if (u.simulated) {
    std::printf("usage:  not measured (its host runs libvirt's test driver, whose figures are made up)\n");
    return;
  }
  if (u.running)
    std::printf("cpu:    %.2f s; %.1f%% of %lld vCPU(s) over the last %.1f s\n", u.cpu_time_s, u.cpu_share * 100,
                (long long)u.vcpus, u.window_s);
  else
    std::printf("cpu:    %.2f s (not running)\n", u.cpu_time_s);
  if (u.running)
    std::printf("memory: %lld MB%s\n", (long long)u.memory_mb,
                u.rss_mb < 0 ? "" : fmt::format("; {} MB held on the host", u.rss_mb).c_str());
  if (u.disk_capacity >= 0)
    std::printf("disk:   %.1f MB allocated of %.1f MB (its overlay)\n", double(u.disk_allocation) / 1048576,
                double(u.disk_capacity) / 1048576);
}

// What the instance uses, asked of its agent the way a console is (a request under a short
// lease of our own, answered under it); nothing, and a line on stderr, when the host has no
// running agent or it does not answer within `timeout_s`.
awaitable<result<std::optional<InstanceUsage>>> ask_usage(EtcdClient& etcd,
                                                          const KeyLayout& keys, const InstanceRecord& record,
                                                          double timeout_s) {
  std::optional<InstanceUsage> none;
  if (record.state != InstanceState::active && record.state != InstanceState::stopped) co_return none;
  auto alive = co_await etcd.range(keys.host(record.host));
  if (!alive) co_return alive.error();
  if (alive->kvs.empty()) {
    std::fprintf(stderr, "toyvm: the host of instance %s has no running agent: no usage figures\n",
                 record.uuid.c_str());
    co_return none;
  }
  auto lease = co_await etcd.lease_grant(int64_t(timeout_s) + 5);
  if (!lease) co_return lease.error();
  auto asked = co_await etcd.put(keys.usage_request(record.host, record.uuid), "", *lease);
  if (!asked) co_return asked.error();
  std::optional<InstanceUsage> usage;
  auto answered = [&](const WatchEvent& event) {
    if (event.type == WatchEvent::Type::put) {
      if (auto told = decode_usage(event.kv.value)) usage = *told;
    }
    return usage.has_value();
  };
  auto followed = co_await follow_key(etcd, keys.usage(record.uuid), *asked + 1,
                                      std::chrono::milliseconds(int64_t(timeout_s * 1000)), answered);
  co_await etcd.lease_revoke(*lease);  // the request and the answer go with it
  if (!followed) co_return followed.error();
  if (usage) co_return usage;
  std::fprintf(stderr, "toyvm: the host of instance %s did not tell its usage within %g s\n", record.uuid.c_str(),
               timeout_s);
  co_return none;
}

awaitable<int> show_one(EtcdClient& etcd, const KeyLayout& keys, const ShowOptions& options) {
  auto found = co_await etcd.range(keys.instance(options.uuid));
  if (!found) co_return etcd_failure(etcd, found.error());
  if (found->kvs.empty())
    co_return report_failure(errc::not_found, fmt::format("no instance {}", options.uuid));
  std::string detail;
  auto record = decode_instance(found->kvs.front().value, &detail);
  if (!record)
    co_return report_failure(record.error(), fmt::format("instance {} has a corrupt record in etcd: {}",
                                                         options.uuid, detail));
  auto usage = co_await ask_usage(etcd, keys, *record, options.timeout_s);
  if (!usage) co_return etcd_failure(etcd, usage.error());
  if (options.json) {
    json::object shown = instance_json(*record);
    shown["usage"] = *usage ? json::parse(encode(**usage)) : json::value(nullptr);  // as the agent put it
    std::printf("%s\n", json::serialize(shown).c_str());
    co_return 0;
  }
  std::printf("uuid:   %s\n", record->uuid.c_str());
  // Names and messages are anyone's text: never an escape sequence to the terminal.
  if (!record->name.empty()) std::printf("name:   %s\n", printable_line(record->name).c_str());
  std::printf("state:  %s\n", std::string(to_string(record->state)).c_str());
  std::printf("host:   %s\n", record->host.c_str());
  std::printf("ip:     %s\n", !record->ip.empty() ? record->ip.c_str()
                             : record->no_address ? "- (none within the host's address_timeout)"
                                                  : "-");
  if (!record->error_code.empty())
    std::printf("error:  %s: %s%s\n", printable_line(record->error_code).c_str(),
                printable_line(record->error_message).c_str(),
                record->releasing ? " (its allocation is being released)" : "");
  if (*usage) print_usage(**usage);
  co_return 0;
}

void print_console(std::string_view text, bool raw) {
  const std::string shown = raw ? std::string(text) : printable_console(text);
  std::fwrite(shown.data(), 1, shown.size(), stdout);
  std::fflush(stdout);
}

// While a console is followed: renews the request's lease every 3 s, and puts the request
// again under a new lease if etcd dropped that one (away for longer than its TTL). etcd not
// answering meanwhile is waited out. Runs until cancelled.
awaitable<void> keep_asking(EtcdClient& etcd, std::string request_key, int64_t lease) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  std::unique_ptr<EtcdLeaseKeeper> keeper;
  while (true) {
    timer.expires_after(std::chrono::seconds(3));
    co_await timer.async_wait(use_awaitable);
    if (!keeper) keeper = etcd.keep_alive(lease);
    auto ttl = co_await keeper->ping();
    if (ttl && *ttl > 0) continue;
    keeper.reset();  // a broken stream, or a lease that is gone
    if (!ttl) continue;
    auto renewed = co_await etcd.lease_grant(10);
    if (renewed && co_await etcd.put(request_key, "", *renewed)) lease = *renewed;
  }
}

// The tail of the serial console: a request under a short lease of our own asks the
// instance's agent to publish it (under the same lease, so both go when we do).
awaitable<int> show_console(EtcdClient& etcd, const KeyLayout& keys, const ShowOptions& options) {
  auto found = co_await etcd.range(keys.instance(options.uuid));
  if (!found) co_return etcd_failure(etcd, found.error());
  if (found->kvs.empty()) co_return report_failure(errc::not_found, fmt::format("no instance {}", options.uuid));
  auto record = decode_instance(found->kvs.front().value);
  if (!record) co_return report_failure(ExitCode::failed, fmt::format("instance {} has a corrupt record", options.uuid));
  auto lease = co_await etcd.lease_grant(10);
  if (!lease) co_return etcd_failure(etcd, lease.error());
  const std::string asker = fmt::format("{:x}", *lease);
  const std::string request_key = keys.console_request(record->host, options.uuid, asker);
  const std::string console_key = keys.console(options.uuid, asker);
  auto asked = co_await etcd.put(request_key, "", *lease);
  if (!asked) co_return etcd_failure(etcd, asked.error());

  int64_t revision = *asked;
  std::string shown;
  bool answered = false;
  std::function<bool(const WatchEvent&)> published = [&](const WatchEvent& event) {
    if (event.type != WatchEvent::Type::put) return false;
    const std::string& tail = event.kv.value;
    if (!answered && tail.empty())
      std::fprintf(stderr, "toyvm: instance %s has no console output yet\n", options.uuid.c_str());
    print_console(console_growth(shown, tail), options.raw);
    shown = tail;
    revision = event.kv.mod_revision;
    return !std::exchange(answered, true) || !options.follow;
  };
  // The host has timeout_s to answer.
  auto first = co_await follow_key(etcd, console_key, revision + 1,
                                   std::chrono::milliseconds(int64_t(options.timeout_s * 1000)), published);
  if (!first) co_return etcd_failure(etcd, first.error());
  if (!*first)
    co_return report_failure(ExitCode::failed, fmt::format("the host of instance {} did not publish its console "
                                                           "within {} s; it may be down",
                                                           options.uuid, options.timeout_s));
  if (options.follow) {
    using namespace asio::experimental::awaitable_operators;
    // Until interrupted: follow_key rides over etcd going away, keep_asking keeps the request.
    co_await (follow_key(etcd, console_key, revision + 1, std::chrono::hours(24 * 365), published) ||
              keep_asking(etcd, request_key, *lease));
  }
  if (!shown.empty() && shown.back() != '\n') std::fputc('\n', stdout);
  co_await etcd.lease_revoke(*lease);  // the request and the console go with it
  co_return 0;
}

// What a watcher of instances is told about: a change of state, address or error. A record
// rewritten with the same (a timestamp, a retry's attempt) is no news.
bool same_news(const InstanceRecord& a, const InstanceRecord& b) {
  return a.state == b.state && a.ip == b.ip && a.host == b.host && a.error_code == b.error_code &&
         a.no_address == b.no_address;
}

std::string utc_time(int64_t unix_ms) {
  std::time_t seconds = std::time_t(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", text, int(unix_ms % 1000));
}

void print_event(const InstanceRecord& r, bool deleted, bool as_json) {
  const int64_t at = deleted || r.updated_at == 0 ? unix_millis() : r.updated_at;
  if (as_json) {
    json::object o = instance_json(r);
    if (deleted) o["state"] = "DELETED";
    o["time"] = utc_time(at);
    std::printf("%s\n", json::serialize(o).c_str());
  } else {
    std::string line = fmt::format("{}  {}  {:<8}  host {}", utc_time(at), r.uuid,
                                   deleted ? "DELETED" : to_string(r.state), r.host.empty() ? "-" : r.host);
    if (!deleted && !r.ip.empty()) line += "  ip " + r.ip;
    if (!deleted && !r.error_code.empty())
      line += fmt::format("  error {}: {}", printable_line(r.error_code), printable_line(r.error_message));
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

// Follows instance records in etcd and prints each change as it happens, until interrupted
// (or, for one instance, until it is deleted). After a lost watch the listing is compared
// with what was last printed, so a change made meanwhile is still told, once.
awaitable<int> show_watch(EtcdClient& etcd, const KeyLayout& keys, const ShowOptions& options) {
  const bool one = !options.uuid.empty();
  const std::string key = one ? keys.instance(options.uuid) : keys.instances_prefix();
  const std::string range_end = one ? std::string() : prefix_range_end(key);
  auto first = co_await etcd.range(key, range_end);
  if (!first) co_return etcd_failure(etcd, first.error());
  if (one && first->kvs.empty()) co_return report_failure(errc::not_found, fmt::format("no instance {}", options.uuid));
  std::map<std::string, InstanceRecord> known;  // by key
  bool gone = false;
  auto changed = [&](const KeyValue& kv, bool erased) {
    auto was = known.find(kv.key);
    if (erased) {
      if (was == known.end()) return;
      print_event(was->second, true, options.json);
      known.erase(was);
      gone = one;
      return;
    }
    auto record = decode_instance(kv.value);
    if (!record) return;  // a corrupt record is `toyvm audit`'s business
    if (was == known.end() || !same_news(was->second, *record)) print_event(*record, false, options.json);
    known[kv.key] = std::move(*record);
  };
  for (const KeyValue& kv : first->kvs)
    if (auto record = decode_instance(kv.value)) known[kv.key] = std::move(*record);
  bool listed_once = false;
  co_await follow_range(
      etcd, key, range_end,
      [&](const RangeResult& listing) {
        if (!std::exchange(listed_once, true)) return;  // the first listing is the one just read
        std::set<std::string> present;
        for (const KeyValue& kv : listing.kvs) {
          present.insert(kv.key);
          changed(kv, false);
        }
        for (auto it = known.begin(); it != known.end();) {
          auto next = std::next(it);
          if (!present.count(it->first)) changed(KeyValue{it->first, {}, 0, 0, 0, 0}, true);
          it = next;
        }
      },
      [&](const WatchEvent& event) { changed(event.kv, event.type == WatchEvent::Type::erase); },
      [&] { return gone; });
  co_return 0;
}

awaitable<int> show_all(EtcdClient& etcd, const KeyLayout& keys, const ShowOptions& options) {
  auto listed = co_await etcd.range_prefix(keys.instances_prefix());
  if (!listed) co_return etcd_failure(etcd, listed.error());
  json::array all;
  if (!options.json) std::printf("%-36s  %-9s  %-36s  %s\n", "UUID", "STATE", "HOST", "IP");
  for (const KeyValue& kv : listed->kvs) {
    auto record = decode_instance(kv.value);
    if (!record) {
      spdlog::warn("skipping corrupt record {}", kv.key);
      continue;
    }
    if (options.json) {
      all.push_back(instance_json(*record));
    } else {
      std::printf("%-36s  %-9s  %-36s  %s\n", record->uuid.c_str(),
                  std::string(to_string(record->state)).c_str(), record->host.c_str(),
                  record->ip.empty() ? "-" : record->ip.c_str());
    }
  }
  if (options.json) std::printf("%s\n", json::serialize(all).c_str());
  co_return 0;
}

json::object stats_json(const HostStats& s) {
  return json::object{{"mem_total_mb", s.mem_total_mb},   {"mem_available_mb", s.mem_available_mb},
                      {"disk_total_mb", s.disk_total_mb}, {"disk_available_mb", s.disk_available_mb},
                      {"load", s.load},                   {"cpus_online", s.cpus_online},
                      {"at", s.at}};
}

// Hosts with a record are alive (the record lives on the agent's lease); hosts that still
// have work but no record are listed as dead. Beside Placement's capacity and the usage of
// their work: the figures their agents measure, and an operator's disable.
awaitable<int> show_hosts(EtcdClient& etcd, const KeyLayout& keys, const ShowOptions& options) {
  // One transaction reads them all at the same revision.
  auto all_of = [](std::string prefix) { return EtcdOp::get(prefix, prefix_range_end(prefix)); };
  std::vector<EtcdOp> reads{all_of(keys.hosts_prefix()), all_of(keys.work_root()), all_of(keys.stats_prefix()),
                            all_of(keys.disabled_prefix()), all_of(keys.domains_root())};
  auto txn = co_await etcd.txn({}, std::move(reads));
  if (!txn) co_return etcd_failure(etcd, txn.error());
  struct Row {
    std::optional<HostRecord> record;
    std::optional<HostStats> stats;
    std::optional<HostMaintenance> disabled;
    ResourceAmounts usage;
    int instances = 0;
    int64_t domains = 0;
  };
  std::map<std::string, Row> rows;
  for (const KeyValue& kv : txn->ranges[0].kvs) {
    auto record = decode_host(kv.value);
    if (record) rows[record->provider].record = std::move(*record);
  }
  for (const KeyValue& kv : txn->ranges[1].kvs) {
    auto key = keys.parse_work(kv.key);
    auto spec = decode_work(kv.value);
    if (!key || !spec) continue;
    Row& row = rows[key->host];
    row.instances += 1;
    for (auto& [rc, n] : spec->resources) row.usage[rc] += n;
  }
  for (const KeyValue& kv : txn->ranges[2].kvs) {
    auto provider = keys.leaf(kv.key, keys.stats_prefix());
    auto stats = decode_host_stats(kv.value);
    if (provider && stats && rows.count(*provider)) rows[*provider].stats = *stats;
  }
  for (const KeyValue& kv : txn->ranges[3].kvs) {
    auto provider = keys.leaf(kv.key, keys.disabled_prefix());
    if (!provider) continue;
    auto disabled = decode_maintenance(kv.value);
    rows[*provider].disabled = disabled ? *disabled : HostMaintenance{"(unreadable)", 0};
  }
  for (const KeyValue& kv : txn->ranges[4].kvs) {
    auto key = keys.parse_domain(kv.key);
    if (auto row = key ? rows.find(key->host) : rows.end(); row != rows.end()) row->second.domains += 1;
  }
  json::array all;
  if (!options.json)
    std::printf("%-20s  %-36s  %-5s  %-8s  %-9s  %-7s  %-5s  %-13s  %-15s  %-40s  %s\n", "NAME", "PROVIDER", "ALIVE",
                "STATUS", "INSTANCES", "DOMAINS", "LOAD", "MEM_AVAIL_MB", "DISK_AVAIL_MB", "CAPACITY", "USAGE");
  for (auto& [provider, row] : rows) {
    std::string name = row.record ? printable_line(row.record->name) : "-";
    std::string status = row.record ? row.record->status : row.disabled ? "DISABLED" : "-";
    ResourceAmounts capacity = row.record ? row.record->capacity : ResourceAmounts{};
    if (options.json) {
      json::object cap, use;
      for (auto& [rc, n] : capacity) cap[rc] = n;
      for (auto& [rc, n] : row.usage) use[rc] = n;
      json::object o{{"provider", provider}, {"name", name}, {"alive", row.record.has_value()},
                     {"status", status}, {"instances", row.instances},
                     {"domains", row.domains},
                     {"capacity", cap}, {"usage", use}};
      o["stats"] = row.stats ? json::value(stats_json(*row.stats)) : json::value(nullptr);
      o["disabled"] = row.disabled ? json::value(json::object{{"reason", row.disabled->reason}, {"at", row.disabled->at}})
                                   : json::value(nullptr);
      all.push_back(std::move(o));
    } else {
      std::string load = row.stats ? fmt::format("{:.2f}", row.stats->load) : "-";
      std::string memory = row.stats ? fmt::format("{}/{}", row.stats->mem_available_mb, row.stats->mem_total_mb) : "-";
      std::string disk = row.stats ? fmt::format("{}/{}", row.stats->disk_available_mb, row.stats->disk_total_mb) : "-";
      std::string why = row.disabled ? fmt::format("  disabled: {}", row.disabled->reason.empty()
                                                                          ? "-"
                                                                          : printable_line(row.disabled->reason))
                                     : "";
      std::printf("%-20s  %-36s  %-5s  %-8s  %-9d  %-7lld  %-5s  %-13s  %-15s  %-40s  %s%s\n", name.c_str(),
                  provider.c_str(), row.record ? "yes" : "no", status.c_str(), row.instances,
                  static_cast<long long>(row.domains), load.c_str(), memory.c_str(),
                  disk.c_str(), amounts_text(capacity).c_str(), amounts_text(row.usage).c_str(), why.c_str());
    }
  }
  if (options.json) std::printf("%s\n", json::serialize(all).c_str());
  co_return 0;
}

// Without the host, and only as it was read: the keys go in one transaction guarded by the
// revisions of the record and the work read here, so an instance that an evacuation or a
// move took elsewhere meanwhile is left alone; then its allocation, guarded by the consumer
// generation read before (one that moved since is left for `toyvm audit` to judge).
awaitable<int> force_destroy(asio::io_context& io, EtcdClient& etcd, const KeyLayout& keys, const Config& config,
                             const InstanceRecord& record, int64_t record_revision) {
  PlacementClient placement(io.get_executor(), config.placement);
  auto held = co_await placement.consumer_allocations(record.uuid);
  if (!held)
    co_return report_failure(placement.last_error().code, fmt::format("reading the allocation of {}: {}", record.uuid,
                                                                      placement.last_error().detail));
  if (!held->allocations.empty() && !held->allocations.count(record.host))
    co_return report_failure(errc::changed,
                             fmt::format("instance {} holds its resources on another host than {} (a move in flight?); "
                                         "nothing removed",
                                         record.uuid, record.host));
  const std::string work_key = keys.work(record.host, record.uuid);
  auto work = co_await etcd.range(work_key);
  if (!work) co_return etcd_failure(etcd, work.error());
  std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(keys.instance(record.uuid), record_revision)};
  std::string group;
  if (work->kvs.empty()) {
    as_read.push_back(EtcdCompare::absent(work_key));
  } else {
    as_read.push_back(EtcdCompare::mod_revision_is(work_key, work->kvs.front().mod_revision));
    if (auto spec = decode_work(work->kvs.front().value)) group = spec->group;
  }
  std::vector<EtcdOp> erase;
  for (auto& [key, range_end] : keys.instance_keys(record.host, record.uuid, group))
    erase.push_back(EtcdOp::erase(key, range_end));
  co_await failpoint::pass("destroy.force");  // read, not yet written
  auto txn = co_await etcd.txn(std::move(as_read), std::move(erase));
  if (!txn) co_return etcd_failure(etcd, txn.error());
  if (!txn->succeeded)
    co_return report_failure(errc::changed, fmt::format("instance {} changed while it was being destroyed (moved, "
                                                         "evacuated, or its host came back); nothing removed",
                                                         record.uuid));
  if (held->generation && !held->allocations.empty()) {
    auto released = co_await placement.replace(record.uuid, {}, *held->generation);
    if (!released)
      co_return report_failure(released.error(),
                               fmt::format("instance {} is removed, but its allocation was not released ({}); "
                                           "`toyvm audit --fix` releases it",
                                           record.uuid, placement.last_error().detail));
  }
  std::printf("DESTROYED INSTANCE %s\n", record.uuid.c_str());
  co_return 0;
}

// The instance's record and the work key its host follows.
struct Target {
  InstanceRecord record;
  int64_t revision = 0;      // of the read: a watch from here misses nothing
  int64_t mod_revision = 0;  // of the record
};

awaitable<std::variant<Target, int>> find_target(EtcdClient& etcd, const KeyLayout& keys, const std::string& uuid) {
  auto found = co_await etcd.range(keys.instance(uuid));
  if (!found) co_return etcd_failure(etcd, found.error());
  if (found->kvs.empty()) co_return report_failure(errc::not_found, fmt::format("no instance {}", uuid));
  auto record = decode_instance(found->kvs.front().value);
  if (!record || !is_uuid(record->host))
    co_return report_failure(errc::corrupt_record, fmt::format("instance {} has a corrupt record in etcd", uuid));
  co_return Target{std::move(*record), found->revision, found->kvs.front().mod_revision};
}

// Desired power on the work key, written only over the version we read; 0 on success.
awaitable<int> request_power(EtcdClient& etcd, const KeyLayout& keys, const InstanceRecord& record, PowerState power) {
  const std::string work_key = keys.work(record.host, record.uuid);
  auto work = co_await etcd.range(work_key);
  if (!work) co_return etcd_failure(etcd, work.error());
  if (work->kvs.empty())
    co_return report_failure(errc::not_found, fmt::format("instance {} has no work on host {}", record.uuid, record.host));
  auto spec = decode_work(work->kvs.front().value);
  if (!spec)
    co_return report_failure(errc::corrupt_record, fmt::format("instance {} has a corrupt work record in etcd", record.uuid));
  if (spec->power == power) co_return 0;
  if (spec->power == PowerState::deleted)
    co_return report_failure(ExitCode::failed, fmt::format("instance {} is being destroyed", record.uuid));
  spec->power = power;
  std::vector<EtcdCompare> unchanged{EtcdCompare::mod_revision_is(work_key, work->kvs.front().mod_revision)};
  std::vector<EtcdOp> mark{EtcdOp::put(work_key, encode(*spec))};
  auto txn = co_await etcd.txn(std::move(unchanged), std::move(mark));
  if (!txn) co_return etcd_failure(etcd, txn.error());
  if (!txn->succeeded)
    co_return report_failure(ExitCode::failed, fmt::format("instance {} changed meanwhile; try again", record.uuid));
  co_return 0;
}

// Follows the instance key from `revision` until `done` says so or the timeout passes.
template <class Done>
awaitable<int> wait_for_record(EtcdClient& etcd, const KeyLayout& keys, const std::string& uuid, int64_t revision,
                               double timeout_s, const char* waiting_for, Done done) {
  int code = -1;
  auto reached = [&](const WatchEvent& event) {
    std::optional<InstanceRecord> record;
    if (event.type == WatchEvent::Type::put) {
      auto decoded = decode_instance(event.kv.value);
      if (!decoded) return false;  // a corrupt record is `toyvm audit`'s business
      record = std::move(*decoded);
    }
    code = done(record);
    return code >= 0;
  };
  auto followed = co_await follow_key(etcd, keys.instance(uuid), revision + 1,
                                      std::chrono::milliseconds(int64_t(timeout_s * 1000)), reached);
  if (!followed) co_return etcd_failure(etcd, followed.error());
  if (*followed) co_return code;
  co_return report_failure(ExitCode::failed, fmt::format("instance {} is not {} after {} s; its host may be down", uuid,
                                                         waiting_for, timeout_s));
}

}  // namespace

int run_show(const Config& config, const ShowOptions& options) {
  if (!options.uuid.empty() && !is_uuid(options.uuid))
    return report_failure(errc::invalid_argument, fmt::format("'{}' is not an instance uuid", options.uuid));
  return run_on_loop([&](asio::io_context&) -> awaitable<int> {
    auto etcd = EtcdClient::create(config.etcd);
    KeyLayout keys(config.etcd.prefix);
    if (options.hosts) co_return co_await show_hosts(*etcd, keys, options);
    if (options.watch) co_return co_await show_watch(*etcd, keys, options);
    if (options.uuid.empty()) co_return co_await show_all(*etcd, keys, options);
    if (options.console) co_return co_await show_console(*etcd, keys, options);
    co_return co_await show_one(*etcd, keys, options);
  });
}

int run_destroy(const Config& config, const DestroyOptions& options) {
  if (!is_uuid(options.uuid))
    return report_failure(errc::invalid_argument, fmt::format("'{}' is not an instance uuid", options.uuid));
  return run_on_loop([&](asio::io_context& io) -> awaitable<int> {
    auto etcd = EtcdClient::create(config.etcd);
    KeyLayout keys(config.etcd.prefix);
    auto found = co_await find_target(*etcd, keys, options.uuid);
    if (auto* code = std::get_if<int>(&found)) co_return *code;
    const Target& target = std::get<Target>(found);
    if (options.force) co_return co_await force_destroy(io, *etcd, keys, config, target.record, target.mod_revision);
    if (int code = co_await request_power(*etcd, keys, target.record, PowerState::deleted)) co_return code;
    if (!options.wait) {
      std::printf("DESTROYING INSTANCE %s\n", options.uuid.c_str());
      co_return 0;
    }
    // Done when the agent has deleted the instance key.
    auto gone = [](const std::optional<InstanceRecord>& record) { return record ? -1 : 0; };
    if (int code = co_await wait_for_record(*etcd, keys, options.uuid, target.revision, options.wait_timeout_s,
                                            "gone", gone))
      co_return code;
    std::printf("DESTROYED INSTANCE %s\n", options.uuid.c_str());
    co_return 0;
  });
}

int run_power(const Config& config, const PowerOptions& options) {
  if (!is_uuid(options.uuid))
    return report_failure(errc::invalid_argument, fmt::format("'{}' is not an instance uuid", options.uuid));
  const bool on = options.power == PowerState::running;
  const InstanceState wanted = on ? InstanceState::active : InstanceState::stopped;
  return run_on_loop([&](asio::io_context&) -> awaitable<int> {
    auto etcd = EtcdClient::create(config.etcd);
    KeyLayout keys(config.etcd.prefix);
    auto found = co_await find_target(*etcd, keys, options.uuid);
    if (auto* code = std::get_if<int>(&found)) co_return *code;
    const Target& target = std::get<Target>(found);
    if (target.record.state == InstanceState::error)
      co_return report_failure(ExitCode::failed, fmt::format("instance {} is in ERROR ({}); destroy it",
                                                             options.uuid, target.record.error_code));
    if (int code = co_await request_power(*etcd, keys, target.record, options.power)) co_return code;
    const char* verb = on ? "STARTED" : "STOPPED";
    if (options.wait && target.record.state != wanted) {
      auto reached = [&](const std::optional<InstanceRecord>& record) {
        if (!record) return report_failure(errc::not_found, fmt::format("instance {} was destroyed", options.uuid));
        if (record->state == InstanceState::error)
          return report_failure(ExitCode::failed, fmt::format("instance {}: {}: {}", options.uuid,
                                                              record->error_code, record->error_message));
        return record->state == wanted ? 0 : -1;
      };
      if (int code = co_await wait_for_record(*etcd, keys, options.uuid, target.revision, options.wait_timeout_s,
                                              on ? "ACTIVE" : "STOPPED", reached))
        co_return code;
    } else if (!options.wait) {
      verb = on ? "STARTING" : "STOPPING";
    }
    std::printf("%s INSTANCE %s\n", verb, options.uuid.c_str());
    co_return 0;
  });
}

}  // namespace toyvm
