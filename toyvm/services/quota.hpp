#pragma once
// A project's quota as a request meets it: the project's record and limits in etcd, its use as
// Placement counts it. Shared by everything that makes instances or makes them bigger.
//
// The check is Nova's: before claiming (nothing is claimed for a request that cannot fit), and
// again once the claims are made, with them counted (racing requests of one project each see
// the others' claims, and those that end above the quota give theirs back), so no request is
// left above its project's quota.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "core/async.hpp"
#include "core/config.hpp"
#include "model/keys.hpp"
#include "model/projects.hpp"

#include <optional>
#include <span>
#include <string>
#include <vector>

namespace toyvm {

// What a request of a project goes by: the limits that apply to it, and the revision of its
// record, which a hand-over into the project requires unchanged (a project being deleted
// takes nothing new). The default project has no record and is never deleted.
struct ProjectStanding {
  std::string name;
  Limits limits;
  int64_t revision = 0;  // 0: the default project
};

// errc::invalid_argument for a name that is not one; errc::not_found for a project that does
// not exist; errc::changed for one being deleted.
awaitable<result<ProjectStanding>> read_project(EtcdClient& etcd, const KeyLayout& keys, std::string name);
// The same in parts, for a transaction that reads the project beside its own writes: the name
// checked, the reads (three ranges), and their answer judged.
result<void> check_project_name(const std::string& name);
std::vector<EtcdOp> project_reads(const KeyLayout& keys, const std::string& name);
result<ProjectStanding> project_standing(const std::string& name, std::span<const RangeResult> read);

// The compare a hand-over into the project adds to its guard.
std::optional<EtcdCompare> project_guard(const KeyLayout& keys, const ProjectStanding& project);

// Whether `asked` fits the project's quota, its use as Placement counts it (`counted`: the
// asked claims are in it already). errc::over_quota with each limit passed, in numbers.
// No limits: nothing is asked of Placement.
awaitable<result<void>> check_quota(Placement& placement, const PlacementConfig& config,
                                    const ProjectStanding& project, ProjectUsage asked, bool counted);

// Who is asking, as records and Placement name them: the etcd user, else `consumer_user`.
std::string asking_user(const Config& config);

}  // namespace toyvm
