// toyvm show, stop, start and destroy: read and change instances through etcd only. The
// compute agent that owns an instance does the work: powering it, destroying it, releasing
// its allocation.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "model/console.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"
#include "services/common.hpp"
#include "services/services.hpp"

#include <boost/asio/steady_timer.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <spdlog/spdlog.h>

#include <map>
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
  if (options.json) {
    std::printf("%s\n", json::serialize(instance_json(*record)).c_str());
    co_return 0;
  }
  std::printf("uuid:   %s\n", record->uuid.c_str());
  if (!record->name.empty()) std::printf("name:   %s\n", record->name.c_str());
  std::printf("state:  %s\n", std::string(to_string(record->state)).c_str());
  std::printf("host:   %s\n", record->host.c_str());
  std::printf("ip:     %s\n", !record->ip.empty() ? record->ip.c_str()
                             : record->no_address ? "- (none within the host's address_timeout)"
                                                  : "-");
  if (!record->error_code.empty())
    std::printf("error:  %s: %s%s\n", record->error_code.c_str(), record->error_message.c_str(),
                record->releasing ? " (its allocation is being released)" : "");
  co_return 0;
}

void print_console(std::string_view text, bool raw) {
  const std::string shown = raw ? std::string(text) : printable_console(text);
  std::fwrite(shown.data(), 1, shown.size(), stdout);
  std::fflush(stdout);
}

// The tail of the serial console: a request under a short lease of our own asks the
// instance's agent to publish it (under the same lease, so both go when we do).
awaitable<int> show_console(asio::io_context& io, EtcdClient& etcd, const KeyLayout& keys, const ShowOptions& options) {
  auto found = co_await etcd.range(keys.instance(options.uuid));
  if (!found) co_return etcd_failure(etcd, found.error());
  if (found->kvs.empty()) co_return report_failure(errc::not_found, fmt::format("no instance {}", options.uuid));
  auto record = decode_instance(found->kvs.front().value);
  if (!record) co_return report_failure(ExitCode::failed, fmt::format("instance {} has a corrupt record", options.uuid));
  auto lease = co_await etcd.lease_grant(10);
  if (!lease) co_return etcd_failure(etcd, lease.error());
  auto asked = co_await etcd.put(keys.console_request(record->host, options.uuid), "", *lease);
  if (!asked) co_return etcd_failure(etcd, asked.error());

  int64_t revision = *asked;
  std::unique_ptr<EtcdLeaseKeeper> keeper;  // --follow: keeps the request alive while we read
  std::string shown;
  bool answered = false;
  while (true) {
    // Until answered, the host has console_timeout_s; then (following) the watch wakes every
    // 3 s to renew the 10 s lease.
    auto watch = etcd.watch(WatchOptions{keys.console(options.uuid), {}, revision + 1, false});
    WatchDeadline deadline(io.get_executor(), *watch,
                           answered ? std::chrono::milliseconds(3000)
                                    : std::chrono::milliseconds(int64_t(options.console_timeout_s * 1000)));
    while (true) {
      WatchBatch batch = co_await watch->next();
      if (deadline.fired()) break;
      if (batch.error || batch.canceled)
        co_return etcd_failure(etcd, batch.error ? batch.error : make_error_code(errc::etcd_error));
      for (const WatchEvent& event : batch.events) {
        if (event.type != WatchEvent::Type::put) continue;
        const std::string& tail = event.kv.value;
        if (!answered && tail.empty())
          std::fprintf(stderr, "toyvm: instance %s has no console output yet\n", options.uuid.c_str());
        print_console(console_growth(shown, tail), options.raw);
        shown = tail;
        revision = event.kv.mod_revision;
        answered = true;
      }
      if (answered && !options.follow) {
        if (!shown.empty() && shown.back() != '\n') std::fputc('\n', stdout);
        co_await etcd.lease_revoke(*lease);  // the request and the console go with it
        co_return 0;
      }
    }
    if (!answered)
      co_return report_failure(ExitCode::failed, fmt::format("the host of instance {} did not publish its console "
                                                             "within {} s; it may be down",
                                                             options.uuid, options.console_timeout_s));
    if (!keeper) keeper = etcd.keep_alive(*lease);
    auto ttl = co_await keeper->ping();
    if (!ttl) co_return etcd_failure(etcd, ttl.error());
    if (*ttl == 0) co_return report_failure(ExitCode::failed, "etcd dropped the console request's lease");
  }
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

// Hosts with a record are alive (the record lives on the agent's lease); hosts that still
// have work but no record are listed as dead.
awaitable<int> show_hosts(EtcdClient& etcd, const KeyLayout& keys, const ShowOptions& options) {
  // One transaction reads both at the same revision.
  std::vector<EtcdOp> reads{EtcdOp::get(keys.hosts_prefix(), prefix_range_end(keys.hosts_prefix())),
                            EtcdOp::get(keys.work_root(), prefix_range_end(keys.work_root()))};
  auto txn = co_await etcd.txn({}, std::move(reads));
  if (!txn) co_return etcd_failure(etcd, txn.error());
  struct Row {
    std::optional<HostRecord> record;
    ResourceAmounts usage;
    int instances = 0;
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
  json::array all;
  if (!options.json)
    std::printf("%-20s  %-36s  %-5s  %-8s  %-9s  %-7s  %-40s  %s\n", "NAME", "PROVIDER", "ALIVE", "STATUS",
                "INSTANCES", "DOMAINS", "CAPACITY", "USAGE");
  for (auto& [provider, row] : rows) {
    std::string name = row.record ? row.record->name : "-";
    std::string status = row.record ? row.record->status : "-";
    ResourceAmounts capacity = row.record ? row.record->capacity : ResourceAmounts{};
    if (options.json) {
      json::object cap, use;
      for (auto& [rc, n] : capacity) cap[rc] = n;
      for (auto& [rc, n] : row.usage) use[rc] = n;
      all.push_back(json::object{{"provider", provider}, {"name", name}, {"alive", row.record.has_value()},
                                 {"status", status}, {"instances", row.instances},
                                 {"domains", row.record ? row.record->domains : 0},
                                 {"capacity", cap}, {"usage", use}});
    } else {
      std::printf("%-20s  %-36s  %-5s  %-8s  %-9d  %-7lld  %-40s  %s\n", name.c_str(), provider.c_str(),
                  row.record ? "yes" : "no", status.c_str(), row.instances,
                  static_cast<long long>(row.record ? row.record->domains : 0),
                  amounts_text(capacity).c_str(), amounts_text(row.usage).c_str());
    }
  }
  if (options.json) std::printf("%s\n", json::serialize(all).c_str());
  co_return 0;
}

// Without the host: the allocation goes first (if Placement is down nothing is removed and
// the command can be repeated), then every key of the instance in one transaction.
awaitable<int> force_destroy(asio::io_context& io, EtcdClient& etcd, const KeyLayout& keys, const Config& config,
                             const InstanceRecord& record) {
  PlacementClient placement(io.get_executor(), config.placement);
  if (!co_await placement.release(record.uuid))
    co_return report_failure(placement.last_error().code, fmt::format("releasing the allocation of {}: {}",
                                                                      record.uuid, placement.last_error().detail));
  const std::string work_key = keys.work(record.host, record.uuid);
  std::vector<EtcdOp> erase{EtcdOp::erase(work_key), EtcdOp::erase(keys.instance(record.uuid))};
  auto work = co_await etcd.range(work_key);
  if (!work) co_return etcd_failure(etcd, work.error());
  if (!work->kvs.empty()) {
    auto spec = decode_work(work->kvs.front().value);
    if (spec && !spec->group.empty()) erase.push_back(EtcdOp::erase(keys.group_member(spec->group, record.uuid)));
  }
  std::vector<EtcdCompare> always;
  auto txn = co_await etcd.txn(std::move(always), std::move(erase));
  if (!txn) co_return etcd_failure(etcd, txn.error());
  std::printf("DESTROYED INSTANCE %s\n", record.uuid.c_str());
  co_return 0;
}

// The instance's record and the work key its host follows.
struct Target {
  InstanceRecord record;
  int64_t revision = 0;  // of the read: a watch from here misses nothing
};

awaitable<std::variant<Target, int>> find_target(EtcdClient& etcd, const KeyLayout& keys, const std::string& uuid) {
  auto found = co_await etcd.range(keys.instance(uuid));
  if (!found) co_return etcd_failure(etcd, found.error());
  if (found->kvs.empty()) co_return report_failure(errc::not_found, fmt::format("no instance {}", uuid));
  auto record = decode_instance(found->kvs.front().value);
  if (!record || !is_uuid(record->host))
    co_return report_failure(errc::corrupt_record, fmt::format("instance {} has a corrupt record in etcd", uuid));
  co_return Target{std::move(*record), found->revision};
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
awaitable<int> wait_for_record(asio::io_context& io, EtcdClient& etcd, const KeyLayout& keys, const std::string& uuid,
                               int64_t revision, double timeout_s, const char* waiting_for, Done done) {
  auto watch = etcd.watch(WatchOptions{keys.instance(uuid), {}, revision + 1, false});
  WatchDeadline deadline(io.get_executor(), *watch, std::chrono::milliseconds(int64_t(timeout_s * 1000)));
  while (true) {
    WatchBatch batch = co_await watch->next();
    if (deadline.fired())
      co_return report_failure(ExitCode::failed, fmt::format("instance {} is not {} after {} s; its host may be down",
                                                             uuid, waiting_for, timeout_s));
    if (batch.error || batch.canceled)
      co_return etcd_failure(etcd, batch.error ? batch.error : make_error_code(errc::etcd_error));
    for (const WatchEvent& event : batch.events) {
      std::optional<InstanceRecord> record;
      if (event.type == WatchEvent::Type::put) {
        auto decoded = decode_instance(event.kv.value);
        if (decoded) record = std::move(*decoded);
      }
      if (int code = done(record); code >= 0) co_return code;
    }
  }
}

}  // namespace

int run_show(const Config& config, const ShowOptions& options) {
  if (!options.uuid.empty() && !is_uuid(options.uuid))
    return report_failure(errc::invalid_argument, fmt::format("'{}' is not an instance uuid", options.uuid));
  return run_on_loop([&](asio::io_context& io) -> awaitable<int> {
    auto etcd = EtcdClient::create(config.etcd);
    KeyLayout keys(config.etcd.prefix);
    if (options.hosts) co_return co_await show_hosts(*etcd, keys, options);
    if (options.uuid.empty()) co_return co_await show_all(*etcd, keys, options);
    if (options.console) co_return co_await show_console(io, *etcd, keys, options);
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
    if (options.force) co_return co_await force_destroy(io, *etcd, keys, config, target.record);
    if (int code = co_await request_power(*etcd, keys, target.record, PowerState::deleted)) co_return code;
    if (!options.wait) {
      std::printf("DESTROYING INSTANCE %s\n", options.uuid.c_str());
      co_return 0;
    }
    // Done when the agent has deleted the instance key.
    auto gone = [](const std::optional<InstanceRecord>& record) { return record ? -1 : 0; };
    if (int code = co_await wait_for_record(io, *etcd, keys, options.uuid, target.revision, options.wait_timeout_s,
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
  return run_on_loop([&](asio::io_context& io) -> awaitable<int> {
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
      if (int code = co_await wait_for_record(io, *etcd, keys, options.uuid, target.revision, options.wait_timeout_s,
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
