#include "model/projects.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <charconv>

namespace toyvm {
namespace {

bool lower_alnum(char c) noexcept { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

// Outside a project name's characters, so no project's id is another's move.
constexpr std::string_view moving_mark = "/moving";

}  // namespace

bool is_project_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 32 || !lower_alnum(name.front())) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return lower_alnum(c) || c == '-' || c == '_'; });
}

std::string placement_project_id(std::string_view consumer_project, std::string_view project) {
  if (project == default_project) return std::string(consumer_project);
  return fmt::format("{}:{}", consumer_project, project);
}

std::string moving_project_id(std::string_view project_id) { return fmt::format("{}{}", project_id, moving_mark); }

std::string instance_project_id(std::string_view project_id) {
  if (project_id.ends_with(moving_mark)) project_id.remove_suffix(moving_mark.size());
  return std::string(project_id);
}

bool is_own_placement_project(std::string_view consumer_project, std::string_view project_id) noexcept {
  if (project_id.ends_with(moving_mark)) project_id.remove_suffix(moving_mark.size());
  if (project_id == consumer_project) return true;
  return project_id.size() > consumer_project.size() + 1 && project_id.starts_with(consumer_project) &&
         project_id[consumer_project.size()] == ':' &&
         is_project_name(project_id.substr(consumer_project.size() + 1));
}

bool is_limit_name(std::string_view name) noexcept {
  if (name == instances_limit) return true;
  return !name.empty() && name.size() <= 255 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

result<LimitSetting> parse_limit_setting(std::string_view text) {
  const size_t eq = text.find('=');
  const std::string_view name = text.substr(0, eq);
  if (eq == std::string_view::npos || !is_limit_name(name))
    return Error(errc::invalid_argument,
                 fmt::format("bad limit '{}' (instances=N or CLASS=N, e.g. VCPU=20; N may be unlimited or default)",
                             text));
  const std::string_view value = text.substr(eq + 1);
  if (value == "default") return LimitSetting{std::string(name), std::nullopt};
  if (value == "unlimited") return LimitSetting{std::string(name), unlimited};
  int64_t n = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < 0)
    return Error(errc::invalid_argument, fmt::format("bad limit '{}': not a count, unlimited or default", text));
  return LimitSetting{std::string(name), n};
}

Limits effective_limits(const Limits& defaults, const Limits& own) {
  Limits out = defaults;
  for (const auto& [name, value] : own) out[name] = value;
  return out;
}

result<ProjectUsage> parse_project_usage(const std::string& body) {
  simdjson::dom::parser parser;
  simdjson::dom::object usages;
  if (parser.parse(body)["usages"].get_object().get(usages)) return Error(errc::placement_error, "bad /usages body");
  ProjectUsage out;
  simdjson::dom::object all;
  // No entry: the project holds nothing.
  if (usages["all"].get_object().get(all)) return out;
  for (auto [name, value] : all) {
    int64_t amount = 0;
    if (value.get_int64().get(amount)) return Error(errc::placement_error, "bad /usages body");
    if (name == "consumer_count") {
      out.instances = amount;
    } else if (amount != 0) {
      out.amounts[std::string(name)] = amount;
    }
  }
  return out;
}

std::vector<std::string> over_quota(const Limits& limits, const ProjectUsage& used, const ProjectUsage& asked) {
  std::vector<std::string> out;
  auto check = [&](std::string_view name, int64_t now, int64_t more) {
    auto limit = limits.find(std::string(name));
    if (more <= 0 || limit == limits.end() || limit->second == unlimited || now + more <= limit->second) return;
    out.push_back(fmt::format("{}: {} used + {} asked > {}", name, now, more, limit->second));
  };
  check(instances_limit, used.instances, asked.instances);
  for (const auto& [rc, more] : asked.amounts) {
    auto now = used.amounts.find(rc);
    check(rc, now == used.amounts.end() ? 0 : now->second, more);
  }
  return out;
}

ProjectUsage without(ProjectUsage after, const ProjectUsage& asked) {
  after.instances -= asked.instances;
  for (const auto& [rc, amount] : asked.amounts) after.amounts[rc] -= amount;
  return after;
}

ProjectUsage plus(ProjectUsage used, const ProjectUsage& more) {
  used.instances += more.instances;
  for (const auto& [rc, amount] : more.amounts) used.amounts[rc] += amount;
  return used;
}

}  // namespace toyvm
