#include "model/access.hpp"

#include "model/projects.hpp"

#include <fmt/format.h>

namespace toyvm {

std::string_view to_string(ProjectRole role) noexcept { return role == ProjectRole::member ? "member" : "reader"; }

std::optional<ProjectRole> parse_project_role(std::string_view name) noexcept {
  if (name == "member") return ProjectRole::member;
  if (name == "reader") return ProjectRole::reader;
  return std::nullopt;
}

std::string etcd_role_name(const KeyLayout& keys, std::string_view project, ProjectRole role) {
  return fmt::format("{}:{}:{}", keys.prefix(), project, to_string(role));
}

std::optional<ProjectMembership> parse_etcd_role(const KeyLayout& keys, std::string_view role) {
  const std::string head = keys.prefix() + ":";
  if (!role.starts_with(head)) return std::nullopt;
  role.remove_prefix(head.size());
  const size_t colon = role.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const std::string_view project = role.substr(0, colon);
  auto kind = parse_project_role(role.substr(colon + 1));
  if (!kind || !is_project_name(project)) return std::nullopt;
  return ProjectMembership{std::string(project), *kind};
}

std::vector<KeyGrant> project_grants(const KeyLayout& keys, std::string_view project, ProjectRole role) {
  auto range = [](bool write, std::string prefix) {
    std::string end = prefix_range_end(prefix);
    return KeyGrant{write, std::move(prefix), std::move(end)};
  };
  // Both may read the consoles of its instances: ask (passed on by the scheduler service) and read.
  std::vector<KeyGrant> grants{range(false, keys.project_instances_prefix(project)),
                               range(true, keys.project_console_requests_root() + std::string(project) + "/"),
                               range(false, keys.prefix() + "/console/" + std::string(project) + "/"),
                               KeyGrant{false, keys.project(project), {}},
                               KeyGrant{false, keys.quota(project), {}},
                               KeyGrant{false, keys.quota_defaults(), {}}};
  if (role == ProjectRole::member) {
    grants.push_back(range(true, keys.requests_prefix(project)));
    grants.push_back(range(true, keys.replies_prefix(project)));
  }
  return grants;
}

}  // namespace toyvm
