#pragma once
// Who may reach what of a project, as etcd's own roles say it: a role per project and kind
// of membership, granting key ranges that each end in '/', so that no project's grant covers
// another's keys (etcd has no deny rules, and a range "p/a" would cover "p/ab"). A member
// schedules, stops, starts and destroys through the scheduler service and reads its own
// instances; a reader only reads them; neither reaches Placement or another project's keys.

#include "model/keys.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toyvm {

enum class ProjectRole { member, reader };
std::string_view to_string(ProjectRole role) noexcept;
std::optional<ProjectRole> parse_project_role(std::string_view name) noexcept;

// etcd's role for `role` in `project` of the cloud under the layout's prefix:
// "<prefix>:<project>:<role>", so that two clouds sharing an etcd never share a role.
std::string etcd_role_name(const KeyLayout& keys, std::string_view project, ProjectRole role);
struct ProjectMembership {
  std::string project;
  ProjectRole role = ProjectRole::member;

  bool operator==(const ProjectMembership&) const = default;
};
// The membership an etcd role of this cloud stands for; nothing for any other role.
std::optional<ProjectMembership> parse_etcd_role(const KeyLayout& keys, std::string_view role);

// What the role grants: one key, or [key, range_end).
struct KeyGrant {
  bool write = false;  // read and write; else read only
  std::string key;
  std::string range_end;

  bool operator==(const KeyGrant&) const = default;
};
std::vector<KeyGrant> project_grants(const KeyLayout& keys, std::string_view project, ProjectRole role);

}  // namespace toyvm
