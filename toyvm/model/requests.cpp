#include "model/requests.hpp"

#include "core/base64.hpp"
#include "model/json_fields.hpp"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

namespace toyvm {
namespace {

namespace json = boost::json;
using namespace json_fields;

constexpr std::string_view action_names[] = {"schedule", "stop", "start", "destroy"};

json::array strings_json(const std::vector<std::string>& items) {
  json::array out;
  for (const std::string& item : items) out.emplace_back(item);
  return out;
}

bool read_strings(od::value& value, std::vector<std::string>& out) {
  od::array items;
  if (value.get_array().get(items)) return false;
  for (auto item : items) {
    std::string_view text;
    if (item.get_string().get(text)) return false;
    out.emplace_back(text);
  }
  return true;
}

}  // namespace

std::string_view to_string(RequestAction action) noexcept { return action_names[int(action)]; }

std::string encode(const ProjectRequest& r) {
  json::object o{{"action", to_string(r.action)}, {"user", r.user}, {"asked_at", r.asked_at}};
  if (r.action != RequestAction::schedule) {
    o["instance"] = r.instance;
    return json::serialize(o);
  }
  o["query"] = r.query;
  o["count"] = r.count;
  for (auto [name, value] : {std::pair{"name", &r.name}, {"image", &r.image}, {"image_sha256", &r.image_sha256},
                             {"image_format", &r.image_format}, {"availability_zone", &r.availability_zone},
                             {"group", &r.group}, {"group_policy", &r.group_policy}, {"policy", &r.policy}})
    if (!value->empty()) o[name] = *value;
  if (!r.user_data.empty()) o["user_data"] = base64_encode(r.user_data);
  if (!r.keys.empty()) {
    json::array keys;
    for (auto& [name, key] : r.keys) keys.push_back(json::object{{"name", name}, {"key", key}});
    o["keys"] = std::move(keys);
  }
  if (r.config_drive) o["config_drive"] = true;
  return json::serialize(o);
}

std::string encode(const ProjectReply& r) {
  json::object o{{"exit_code", r.exit_code}, {"lines", strings_json(r.lines)}};
  if (!r.error.empty()) o["error"] = r.error;
  if (!r.instances.empty()) o["instances"] = strings_json(r.instances);
  return json::serialize(o);
}

result<ProjectRequest> decode_request(std::string_view text) {
  ProjectRequest r;
  int64_t count = 1;
  bool has_action = false;
  Reader reader(text);
  auto parsed = reader.each_field([&](std::string_view key, od::value& v) {
    if (key == "action") return has_action = read_enum(v, action_names, r.action);
    if (key == "user") return read_string(v, r.user);
    if (key == "asked_at") return read_int(v, r.asked_at);
    if (key == "instance") return read_string(v, r.instance);
    if (key == "query") return read_string(v, r.query);
    if (key == "count") return read_int(v, count) && count >= 1 && count <= 10000;
    if (key == "name") return read_string(v, r.name);
    if (key == "image") return read_string(v, r.image);
    if (key == "image_sha256") return read_string(v, r.image_sha256);
    if (key == "image_format") return read_string(v, r.image_format);
    if (key == "availability_zone") return read_string(v, r.availability_zone);
    if (key == "group") return read_string(v, r.group);
    if (key == "group_policy") return read_string(v, r.group_policy);
    if (key == "policy") return read_string(v, r.policy);
    if (key == "user_data") {
      std::string encoded;
      if (!read_string(v, encoded)) return false;
      auto decoded = base64_decode(encoded);
      if (decoded) r.user_data = std::move(*decoded);
      return decoded.has_value();
    }
    if (key == "keys") return read_named_keys(v, r.keys);
    if (key == "config_drive") return !v.get_bool().get(r.config_drive);
    return true;
  });
  if (!parsed) return parsed.error();
  if (auto ok = require(has_action, "action"); !ok) return ok.error();
  r.count = int(count);
  return r;
}

result<ProjectReply> decode_reply(std::string_view text) {
  ProjectReply r;
  int64_t code = 0;
  Reader reader(text);
  auto parsed = reader.each_field([&](std::string_view key, od::value& v) {
    if (key == "exit_code") return read_int(v, code) && code >= 0 && code < 256;
    if (key == "lines") return read_strings(v, r.lines);
    if (key == "error") return read_string(v, r.error);
    if (key == "instances") return read_strings(v, r.instances);
    return true;
  });
  if (!parsed) return parsed.error();
  r.exit_code = int(code);
  return r;
}

}  // namespace toyvm
