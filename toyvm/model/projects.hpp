#pragma once
// Projects: the teams that share one cloud, each holding its own instances and spending only
// its own quota. Pure: names, Placement's ids for them, and the quota's arithmetic.
//
// A project's use is what Placement counts for its project id, every consumer of it (GET
// /usages?project_id=&consumer_type=all). A move's migration consumer is in a Placement project
// of its own beside it (`moving_project_id`), so a guest that moves is counted once and a
// resize at its new size. Why not ask for the INSTANCE type: Placement 8.0.0 answers 500 to a
// query by one consumer type when its database is PostgreSQL (it groups by the type and
// selects the resource class outside the grouping); `all` is counted by another query that
// every database takes.

#include "core/error.hpp"
#include "model/candidates.hpp"
#include "model/query.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace toyvm {

// Where instances made before projects are, and where a request that names none goes.
inline constexpr std::string_view default_project = "default";

// 1 to 32 of a-z 0-9 - _, starting with a letter or a digit: a key segment with nothing to
// escape, and a Placement id.
bool is_project_name(std::string_view name) noexcept;

// Placement's project_id for a project of this toyvm: the default project keeps the id toyvm's
// claims always had (`consumer_project`), so a cloud made before projects is already in it;
// the others' are "<consumer_project>:<name>". Audit judges the consumers of every such id.
std::string placement_project_id(std::string_view consumer_project, std::string_view project);
// A migration consumer's project id: its instance's, marked as moving (the instance's owner
// still reads in it). `instance_project_id` is the way back; an id without the mark is its
// own (a migration consumer made before the mark).
std::string moving_project_id(std::string_view project_id);
std::string instance_project_id(std::string_view project_id);
// One of this toyvm's projects, or a move of one of them.
bool is_own_placement_project(std::string_view consumer_project, std::string_view project_id) noexcept;

// A quota: the most a project may hold, of "instances" and of any resource class. A class
// that is not named has no limit; a limit of `unlimited` lifts a default.
using Limits = std::map<std::string, int64_t>;
inline constexpr std::string_view instances_limit = "instances";
inline constexpr int64_t unlimited = -1;

// "instances" or a resource class name (A-Z 0-9 _).
bool is_limit_name(std::string_view name) noexcept;
// `NAME=N`, `NAME=unlimited`, or `NAME=default` (nullopt: the project's own value goes and
// the default applies).
struct LimitSetting {
  std::string name;
  std::optional<int64_t> value;
};
result<LimitSetting> parse_limit_setting(std::string_view text);
// The limits that apply to a project: its own over the defaults.
Limits effective_limits(const Limits& defaults, const Limits& own);

struct ProjectUsage {
  int64_t instances = 0;
  ResourceAmounts amounts;

  bool operator==(const ProjectUsage&) const = default;
};
// The body of GET /usages?project_id=&consumer_type=all (microversion 1.38).
result<ProjectUsage> parse_project_usage(const std::string& body);

// What of `asked` would take the project above its limits, one line per limit passed, as
// "VCPU: 18 used + 4 asked > 20"; empty when it fits. A limit set below what is used already
// refuses every request that asks for more of it.
std::vector<std::string> over_quota(const Limits& limits, const ProjectUsage& used, const ProjectUsage& asked);
// `after` less `asked` (a use counted with the asked claims in it, as before them).
ProjectUsage without(ProjectUsage after, const ProjectUsage& asked);
// `used` and `more` together (requests asked together).
ProjectUsage plus(ProjectUsage used, const ProjectUsage& more);

}  // namespace toyvm
