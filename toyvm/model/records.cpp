#include "model/records.hpp"

#include "core/base64.hpp"
#include "model/keys.hpp"
#include "model/json_fields.hpp"
#include "model/uuid.hpp"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include <charconv>
#include <chrono>

namespace toyvm {
namespace {

namespace json = boost::json;
namespace od = simdjson::ondemand;
using namespace json_fields;

constexpr std::string_view power_names[] = {"running", "stopped", "deleted"};
constexpr std::string_view state_names[] = {"SCHEDULED", "BUILDING", "ACTIVE",
                                            "STOPPED",   "ERROR",    "DELETING"};

json::object amounts_to_json(const ResourceAmounts& amounts) {
  json::object out;
  for (auto& [rc, amount] : amounts) out[rc] = amount;
  return out;
}

}  // namespace

std::string_view to_string(PowerState power) noexcept { return power_names[int(power)]; }
std::string_view to_string(InstanceState state) noexcept { return state_names[int(state)]; }

int64_t unix_seconds() {
  using namespace std::chrono;
  return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}

int64_t unix_millis() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string encode_hold(int64_t until_ms) { return std::to_string(until_ms); }

namespace {
constexpr std::string_view hold_name_tag = "hold ";
}

std::string encode_hold_name(std::string_view first_instance) {
  return std::string(hold_name_tag) + std::string(first_instance);
}

std::optional<std::string_view> named_hold(std::string_view claim_value) {
  if (!claim_value.starts_with(hold_name_tag) || claim_value.size() == hold_name_tag.size()) return std::nullopt;
  return claim_value.substr(hold_name_tag.size());
}

bool hold_lapsed(std::string_view value, int64_t now_ms) {
  int64_t until = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), until);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size()) return false;
  return now_ms > until + hold_clock_margin_ms;
}

std::string encode(const HostRecord& r) {
  json::object o;
  o["name"] = r.name;
  o["provider"] = r.provider;
  o["status"] = r.status;
  o["capacity"] = amounts_to_json(r.capacity);
  o["agent_version"] = r.agent_version;
  o["started_at"] = r.started_at;
  return json::serialize(o);
}

std::string encode(const HostStats& s) {
  json::object o;
  o["mem_total_mb"] = s.mem_total_mb;
  o["mem_available_mb"] = s.mem_available_mb;
  o["disk_total_mb"] = s.disk_total_mb;
  o["disk_available_mb"] = s.disk_available_mb;
  o["load"] = s.load;
  o["cpus_online"] = s.cpus_online;
  o["at"] = s.at;
  return json::serialize(o);
}

std::string encode(const InstanceUsage& u) {
  json::object o;
  o["running"] = u.running;
  o["vcpus"] = u.vcpus;
  o["cpu_time_s"] = u.cpu_time_s;
  o["cpu_share"] = u.cpu_share;
  o["window_s"] = u.window_s;
  o["memory_mb"] = u.memory_mb;
  auto known = [](int64_t n) { return n < 0 ? json::value(nullptr) : json::value(n); };
  o["rss_mb"] = known(u.rss_mb);
  o["disk_capacity"] = known(u.disk_capacity);
  o["disk_allocation"] = known(u.disk_allocation);
  if (u.simulated) o["simulated"] = true;
  o["at"] = u.at;
  return json::serialize(o);
}

std::string encode(const ProjectRecord& p) {
  json::object o{{"created_at", p.created_at}};
  if (p.deleting) o["deleting"] = true;
  return json::serialize(o);
}

std::string encode_limits(const Limits& limits) {
  json::object o;
  for (const auto& [name, value] : limits) o[name] = value;
  return json::serialize(json::object{{"limits", std::move(o)}});
}

std::string encode(const HostMaintenance& m) {
  return json::serialize(json::object{{"reason", m.reason}, {"at", m.at}});
}

std::string encode(const WorkSpec& s) {
  json::object o;
  o["uuid"] = s.uuid;
  o["name"] = s.name;
  o["project"] = s.project;
  if (!s.user.empty()) o["user"] = s.user;
  o["image"] = s.image;
  if (!s.image_sha256.empty()) o["image_sha256"] = s.image_sha256;
  if (!s.image_format.empty()) o["image_format"] = s.image_format;
  o["query"] = s.query;
  if (!s.availability_zone.empty()) o["availability_zone"] = s.availability_zone;
  o["resources"] = amounts_to_json(s.resources);
  if (!s.user_data.empty()) o["user_data"] = base64_encode(s.user_data);
  if (!s.keys.empty()) {
    json::array keys;
    for (auto& [name, key] : s.keys) keys.push_back(json::object{{"name", name}, {"key", key}});
    o["keys"] = std::move(keys);
  }
  if (s.config_drive) o["config_drive"] = true;
  if (!s.group.empty()) {
    o["group"] = s.group;
    if (s.group_policy) o["group_policy"] = to_string(*s.group_policy);
  }
  o["power"] = to_string(s.power);
  o["attempt"] = s.attempt;
  o["created_at"] = s.created_at;
  return json::serialize(o);
}

std::string encode(const InstanceRecord& r) {
  json::object o;
  o["uuid"] = r.uuid;
  o["name"] = r.name;
  o["project"] = r.project;
  o["host"] = r.host;
  o["state"] = to_string(r.state);
  o["ip"] = r.ip;
  o["mac"] = r.mac;
  if (r.no_address) o["no_address"] = true;
  if (r.releasing) o["releasing"] = true;
  if (!r.error_code.empty()) {
    o["error"] = json::object{{"code", r.error_code}, {"message", r.error_message}};
  }
  o["updated_at"] = r.updated_at;
  return json::serialize(o);
}

result<HostRecord> decode_host(std::string_view text) {
  HostRecord r;
  Reader reader(text);
  auto parsed = reader.each_field([&](std::string_view key, od::value& v) {
    if (key == "name") return read_string(v, r.name);
    if (key == "provider") return read_string(v, r.provider);
    if (key == "status") return read_string(v, r.status);
    if (key == "capacity") return read_amounts(v, r.capacity);
    if (key == "agent_version") return read_string(v, r.agent_version);
    if (key == "started_at") return read_int(v, r.started_at);
    return true;  // unknown fields: written by a newer agent
  });
  if (!parsed) return parsed.error();
  if (auto ok = require(is_uuid(r.provider), "provider"); !ok) return ok.error();
  return r;
}

result<HostStats> decode_host_stats(std::string_view text) {
  HostStats s;
  Reader reader(text);
  auto parsed = reader.each_field([&](std::string_view key, od::value& v) {
    if (key == "mem_total_mb") return read_int(v, s.mem_total_mb);
    if (key == "mem_available_mb") return read_int(v, s.mem_available_mb);
    if (key == "disk_total_mb") return read_int(v, s.disk_total_mb);
    if (key == "disk_available_mb") return read_int(v, s.disk_available_mb);
    if (key == "load") return !v.get_double().get(s.load);
    if (key == "cpus_online") return read_int(v, s.cpus_online);
    if (key == "at") return read_int(v, s.at);
    return true;
  });
  if (!parsed) return parsed.error();
  return s;
}

result<InstanceUsage> decode_usage(std::string_view text) {
  InstanceUsage u;
  Reader reader(text);
  auto parsed = reader.each_field([&](std::string_view key, od::value& v) {
    if (key == "running") return !v.get_bool().get(u.running);
    if (key == "vcpus") return read_int(v, u.vcpus);
    if (key == "cpu_time_s") return !v.get_double().get(u.cpu_time_s);
    if (key == "cpu_share") return !v.get_double().get(u.cpu_share);
    if (key == "window_s") return !v.get_double().get(u.window_s);
    if (key == "memory_mb") return read_int(v, u.memory_mb);
    if (key == "rss_mb") return read_known(v, u.rss_mb);
    if (key == "disk_capacity") return read_known(v, u.disk_capacity);
    if (key == "disk_allocation") return read_known(v, u.disk_allocation);
    if (key == "simulated") return !v.get_bool().get(u.simulated);
    if (key == "at") return read_int(v, u.at);
    return true;
  });
  if (!parsed) return parsed.error();
  return u;
}

result<HostMaintenance> decode_maintenance(std::string_view text) {
  HostMaintenance m;
  Reader reader(text);
  auto parsed = reader.each_field([&](std::string_view key, od::value& v) {
    if (key == "reason") return read_string(v, m.reason);
    if (key == "at") return read_int(v, m.at);
    return true;
  });
  if (!parsed) return parsed.error();
  return m;
}

result<WorkSpec> decode_work(std::string_view text) {
  WorkSpec s;
  int64_t attempt = 1;
  Reader reader(text);
  auto parsed = reader.each_field([&](std::string_view key, od::value& v) {
    if (key == "uuid") return read_string(v, s.uuid);
    if (key == "name") return read_string(v, s.name);
    if (key == "project") return read_string(v, s.project) && is_project_name(s.project);
    if (key == "user") return read_string(v, s.user);
    if (key == "image") return read_string(v, s.image);
    if (key == "image_sha256") return read_string(v, s.image_sha256);
    if (key == "image_format") return read_string(v, s.image_format);
    if (key == "query") return read_string(v, s.query);
    if (key == "availability_zone") return read_string(v, s.availability_zone);
    if (key == "resources") return read_amounts(v, s.resources);
    if (key == "user_data") {
      std::string encoded;
      if (!read_string(v, encoded)) return false;
      auto decoded = base64_decode(encoded);
      if (decoded) s.user_data = std::move(*decoded);
      return decoded.has_value();
    }
    if (key == "keys") return read_named_keys(v, s.keys);
    if (key == "config_drive") return !v.get_bool().get(s.config_drive);
    if (key == "group") return read_string(v, s.group) && is_group_name(s.group);
    if (key == "group_policy") {  // a policy this reader does not know makes the value unreadable
      std::string name;
      if (!read_string(v, name)) return false;
      if (name.empty()) return true;
      s.group_policy = parse_group_policy(name);
      return s.group_policy.has_value();
    }
    if (key == "power") return read_enum(v, power_names, s.power);
    if (key == "attempt") return read_int(v, attempt) && attempt > 0 && attempt < 1000;
    if (key == "created_at") return read_int(v, s.created_at);
    return true;
  });
  if (!parsed) return parsed.error();
  s.attempt = int(attempt);
  if (auto ok = require(is_uuid(s.uuid), "uuid"); !ok) return ok.error();
  return s;
}

result<InstanceRecord> decode_instance(std::string_view text) {
  InstanceRecord r;
  Reader reader(text);
  auto parsed = reader.each_field([&](std::string_view key, od::value& v) {
    if (key == "uuid") return read_string(v, r.uuid);
    if (key == "name") return read_string(v, r.name);
    if (key == "project") return read_string(v, r.project) && is_project_name(r.project);
    if (key == "host") return read_string(v, r.host);
    if (key == "state") return read_enum(v, state_names, r.state);
    if (key == "ip") return read_string(v, r.ip);
    if (key == "mac") return read_string(v, r.mac);
    if (key == "no_address") return !v.get_bool().get(r.no_address);
    if (key == "releasing") return !v.get_bool().get(r.releasing);
    if (key == "updated_at") return read_int(v, r.updated_at);
    if (key == "error") {
      if (v.is_null()) return true;
      od::object error;
      if (v.get_object().get(error)) return false;
      for (auto field : error) {
        std::string_view name;
        if (field.unescaped_key().get(name)) return false;
        od::value inner = field.value();
        if (name == "code" && !read_string(inner, r.error_code)) return false;
        if (name == "message" && !read_string(inner, r.error_message)) return false;
      }
      return true;
    }
    return true;
  });
  if (!parsed) return parsed.error();
  if (auto ok = require(is_uuid(r.uuid), "uuid"); !ok) return ok.error();
  return r;
}

result<ProjectRecord> decode_project(std::string_view text) {
  ProjectRecord p;
  Reader reader(text);
  auto parsed = reader.each_field([&](std::string_view key, od::value& v) {
    if (key == "created_at") return read_int(v, p.created_at);
    if (key == "deleting") return !v.get_bool().get(p.deleting);
    return true;
  });
  if (!parsed) return parsed.error();
  return p;
}

result<Limits> decode_limits(std::string_view text) {
  Limits limits;
  Reader reader(text);
  auto parsed = reader.each_field([&](std::string_view key, od::value& v) {
    if (key == "limits") {
      od::object object;
      if (v.get_object().get(object)) return false;
      for (auto field : object) {
        std::string_view name;
        int64_t limit = 0;
        if (field.unescaped_key().get(name) || field.value().get_int64().get(limit)) return false;
        if (!is_limit_name(name) || limit < unlimited) return false;
        limits[std::string(name)] = limit;
      }
      return true;
    }
    return true;
  });
  if (!parsed) return parsed.error();
  return limits;
}

ConsumerOwner owner_of(const WorkSpec& work, std::string_view consumer_project, std::string_view consumer_user) {
  return {placement_project_id(consumer_project, work.project),
          std::string(work.user.empty() ? consumer_user : work.user)};
}

}  // namespace toyvm
