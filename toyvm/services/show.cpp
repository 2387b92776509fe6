// toyvm show: an instance, every instance, or every host, as etcd has them (an instance's
// usage asked of its agent). Reads only. The modes that follow etcd until interrupted
// (--console, --watch) are in services/show_follow.cpp.

#include "clients/etcd.hpp"
#include "model/console.hpp"
#include "model/keys.hpp"
#include "model/moves.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"
#include "services/common.hpp"
#include "services/member.hpp"
#include "services/instance_lookup.hpp"
#include "services/services.hpp"
#include "services/show.hpp"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <spdlog/spdlog.h>

#include <map>
#include <optional>

namespace toyvm {

namespace json = boost::json;

json::object instance_json(const InstanceRecord& r) {
  json::object o{{"uuid", r.uuid}, {"name", r.name}, {"project", r.project}, {"state", to_string(r.state)},
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

namespace {

std::string amounts_text(const ResourceAmounts& amounts) {
  return amounts.empty() ? "-" : format_amounts(amounts);
}

void say_usage(const InstanceUsage& u, Say& say) {
  if (u.simulated) {
    say.line("usage:  not measured (its host runs libvirt's test driver, whose figures are made up)");
    return;
  }
  if (u.running)
    say.line(fmt::format("cpu:    {:.2f} s; {:.1f}% of {} vCPU(s) over the last {:.1f} s", u.cpu_time_s,
                         u.cpu_share * 100, u.vcpus, u.window_s));
  else
    say.line(fmt::format("cpu:    {:.2f} s (not running)", u.cpu_time_s));
  if (u.running)
    say.line(fmt::format("memory: {} MB{}", u.memory_mb,
                         u.rss_mb < 0 ? "" : fmt::format("; {} MB held on the host", u.rss_mb)));
  if (u.disk_capacity >= 0)
    say.line(fmt::format("disk:   {:.1f} MB allocated of {:.1f} MB (its overlay)", double(u.disk_allocation) / 1048576,
                         double(u.disk_capacity) / 1048576));
}

// What the instance uses, asked of its agent the way a console is (a request under a short
// lease of our own, answered under it); nothing, and a note, when the host has no running
// agent or it does not answer within `timeout`.
awaitable<result<std::optional<InstanceUsage>>> ask_usage(EtcdClient& etcd, const KeyLayout& keys,
                                                          const InstanceRecord& record, Duration timeout, Say& say) {
  std::optional<InstanceUsage> none;
  if (record.state != InstanceState::active && record.state != InstanceState::stopped) co_return none;
  auto alive = co_await etcd.range(keys.host(record.host));
  if (!alive) co_return alive.error();
  if (alive->kvs.empty()) {
    say.note(fmt::format("the host of instance {} has no running agent: no usage figures", record.uuid));
    co_return none;
  }
  auto lease = co_await etcd.lease_grant(std::chrono::ceil<std::chrono::seconds>(timeout).count() + 5);
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
                                      timeout, answered);
  co_await etcd.lease_revoke(*lease);  // the request and the answer go with it
  if (!followed) co_return followed.error();
  if (usage) co_return usage;
  say.note(fmt::format("the host of instance {} did not tell its usage within {:g} s", record.uuid, in_seconds(timeout)));
  co_return none;
}

awaitable<Outcome> show_one(EtcdClient& etcd, const KeyLayout& keys, const ShowOptions& options, Say& say) {
  auto found = co_await find_instance(etcd, keys, options.uuid);
  if (!found) co_return found.error();
  const InstanceRecord* record = &found->record;
  auto usage = co_await ask_usage(etcd, keys, *record, options.timeout, say);
  if (!usage) co_return etcd_error(etcd, usage.error());
  // A move in flight, as its agents last wrote it.
  auto moving = co_await etcd.range(keys.move(record->uuid));
  if (!moving) co_return etcd_error(etcd, moving.error());
  std::optional<result<MoveRecord>> move;
  if (!moving->kvs.empty()) move = decode_move(moving->kvs.front().value);
  if (options.json) {
    json::object shown = instance_json(*record);
    shown["usage"] = *usage ? json::parse(encode(**usage)) : json::value(nullptr);  // as the agent put it
    if (move && *move)
      shown["move"] = json::object{{"kind", to_string((*move)->kind)},   {"state", to_string((*move)->state)},
                                   {"source", (*move)->source},          {"destination", (*move)->destination},
                                   {"started_at", (*move)->started_at}, {"error", (*move)->error},
                                   {"query", (*move)->query}};
    else if (move)
      shown["move"] = json::object{{"unreadable", move->error().message()}};
    say.line(json::serialize(shown));
    co_return ExitCode::ok;
  }
  say.line(fmt::format("uuid:   {}", record->uuid));
  // Names and messages are anyone's text: never an escape sequence to the terminal.
  if (!record->name.empty()) say.line(fmt::format("name:   {}", printable_line(record->name)));
  say.line(fmt::format("project: {}", record->project));
  say.line(fmt::format("state:  {}", to_string(record->state)));
  say.line(fmt::format("host:   {}", record->host));
  say.line(fmt::format("ip:     {}", !record->ip.empty()   ? record->ip
                                     : record->no_address ? "- (none within the host's address_timeout)"
                                                          : "-"));
  if (!record->error_code.empty())
    say.line(fmt::format("error:  {}: {}{}", printable_line(record->error_code), printable_line(record->error_message),
                         record->releasing ? " (its allocation is being released)" : ""));
  if (move && *move)
    say.line(fmt::format("moving: {}{}{} to host {} ({}{}{})", to_string((*move)->kind),
                         (*move)->query.empty() ? "" : " to ", printable_line((*move)->query),
                         (*move)->destination.empty() ? "not chosen yet" : (*move)->destination,
                         to_string((*move)->state), (*move)->error.empty() ? "" : ": ",
                         printable_line((*move)->error)));
  else if (move)
    say.line(fmt::format("moving: its move record cannot be read ({})", printable_line(move->error().message())));
  if (*usage) say_usage(**usage, say);
  co_return ExitCode::ok;
}

// An instance as its project's view has it: the record, nothing of the cloud's around it.
awaitable<Outcome> show_view(EtcdClient& etcd, const RecordsShown& shown, const ShowOptions& options, Say& say) {
  auto found = co_await etcd.range(shown.prefix + options.uuid);
  if (!found) co_return etcd_error(etcd, found.error());
  // Another project's instance is as unknown as one that never was.
  if (found->kvs.empty()) co_return Error(errc::not_found, fmt::format("no instance {}", options.uuid));
  auto record = decode_instance(found->kvs.front().value);
  if (!record) co_return record.error().doing(fmt::format("instance {}", options.uuid));
  if (options.json) {
    say.line(json::serialize(instance_json(*record)));
    co_return ExitCode::ok;
  }
  say.line(fmt::format("uuid:   {}", record->uuid));
  if (!record->name.empty()) say.line(fmt::format("name:   {}", printable_line(record->name)));
  say.line(fmt::format("project: {}", record->project));
  say.line(fmt::format("state:  {}", to_string(record->state)));
  say.line(fmt::format("ip:     {}", record->ip.empty() ? "-" : record->ip));
  if (!record->error_code.empty())
    say.line(fmt::format("error:  {}: {}", printable_line(record->error_code), printable_line(record->error_message)));
  co_return ExitCode::ok;
}

awaitable<Outcome> show_all(EtcdClient& etcd, const RecordsShown& shown, const ShowOptions& options, Say& say) {
  auto listed = co_await etcd.range_prefix(shown.prefix);
  if (!listed) co_return etcd_error(etcd, listed.error());
  json::array all;
  if (!options.json)
    say.line(fmt::format("{:<36}  {:<9}  {:<36}  {:<15}  {}", "UUID", "STATE", "HOST", "IP", "PROJECT"));
  for (const KeyValue& kv : listed->kvs) {
    auto record = decode_instance(kv.value);
    if (!record) {
      spdlog::warn("skipping corrupt record {}", kv.key);
      continue;
    }
    if (options.json) {
      all.push_back(instance_json(*record));
    } else {
      say.line(fmt::format("{:<36}  {:<9}  {:<36}  {:<15}  {}", record->uuid, to_string(record->state), record->host,
                           record->ip.empty() ? "-" : record->ip, record->project));
    }
  }
  if (options.json) say.line(json::serialize(all));
  co_return ExitCode::ok;
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
awaitable<Outcome> show_hosts(EtcdClient& etcd, const KeyLayout& keys, const ShowOptions& options, Say& say) {
  // One transaction reads them all at the same revision.
  auto all_of = [](std::string prefix) { return EtcdOp::get(prefix, prefix_range_end(prefix)); };
  std::vector<EtcdOp> reads{all_of(keys.hosts_prefix()), all_of(keys.work_root()), all_of(keys.stats_prefix()),
                            all_of(keys.disabled_prefix()), all_of(keys.domains_root())};
  auto txn = co_await etcd.txn({}, std::move(reads));
  if (!txn) co_return etcd_error(etcd, txn.error());
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
    say.line(fmt::format("{:<20}  {:<36}  {:<5}  {:<8}  {:<9}  {:<7}  {:<5}  {:<13}  {:<15}  {:<40}  {}", "NAME",
                         "PROVIDER", "ALIVE", "STATUS", "INSTANCES", "DOMAINS", "LOAD", "MEM_AVAIL_MB", "DISK_AVAIL_MB",
                         "CAPACITY", "USAGE"));
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
      say.line(fmt::format("{:<20}  {:<36}  {:<5}  {:<8}  {:<9}  {:<7}  {:<5}  {:<13}  {:<15}  {:<40}  {}{}", name,
                           provider, row.record ? "yes" : "no", status, row.instances, row.domains, load, memory, disk,
                           amounts_text(capacity), amounts_text(row.usage), why));
    }
  }
  if (options.json) say.line(json::serialize(all));
  co_return ExitCode::ok;
}

}  // namespace

Outcome run_show(const Config& config, const ShowOptions& options, Say& say) {
  if (!options.uuid.empty() && !is_uuid(options.uuid))
    return Error(errc::invalid_argument, fmt::format("'{}' is not an instance uuid", options.uuid));
  return run_on_loop([&](asio::io_context&) -> awaitable<Outcome> {
    auto etcd = EtcdClient::create(config.etcd);
    KeyLayout keys(config.etcd.prefix);
    auto membership = co_await caller_membership(*etcd, keys, config.etcd, options.project);
    if (!membership) co_return with_endpoints(*etcd, membership.error());
    RecordsShown shown{keys.instances_prefix(), false};
    if (*membership) {
      shown = RecordsShown{keys.project_instances_prefix((*membership)->project), true};
      if (options.hosts)
        co_return Error(errc::permission_denied, fmt::format("a member of project {} sees its instances: the hosts "
                                                             "are the cloud admin's",
                                                             (*membership)->project));
    }
    if (options.hosts) co_return co_await show_hosts(*etcd, keys, options, say);
    if (options.watch) co_return co_await show_watch(*etcd, shown, options, say);
    if (options.uuid.empty()) co_return co_await show_all(*etcd, shown, options, say);
    if (options.console) {
      std::string member_project = *membership ? (*membership)->project : std::string();
      co_return co_await show_console(*etcd, keys, std::move(member_project), options, say);
    }
    if (shown.member) co_return co_await show_view(*etcd, shown, options, say);
    co_return co_await show_one(*etcd, keys, options, say);
  });
}

}  // namespace toyvm
