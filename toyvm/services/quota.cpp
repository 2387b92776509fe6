#include "services/quota.hpp"

#include "model/records.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <fmt/format.h>

namespace toyvm {

using namespace asio::experimental::awaitable_operators;

result<void> check_project_name(const std::string& name) {
  if (is_project_name(name)) return result<void>{};
  return Error(errc::invalid_argument,
               fmt::format("bad project name '{}' (1 to 32 of a-z 0-9 - _, starting with a letter or digit)", name));
}

std::vector<EtcdOp> project_reads(const KeyLayout& keys, const std::string& name) {
  return {EtcdOp::get(keys.project(name)), EtcdOp::get(keys.quota(name)), EtcdOp::get(keys.quota_defaults())};
}

result<ProjectStanding> project_standing(const std::string& name, std::span<const RangeResult> read) {
  if (read.size() < 3) return Error(errc::etcd_error, "etcd answered the project's reads with too few ranges");
  const RangeResult& record = read[0];
  const RangeResult& own = read[1];
  const RangeResult& defaults = read[2];
  ProjectStanding out{name, {}, 0};
  if (name != default_project) {
    if (record.kvs.empty()) return Error(errc::not_found, fmt::format("unknown project '{}'", name));
    auto project = decode_project(record.kvs.front().value);
    if (!project) return project.error().doing(fmt::format("project '{}'", name));
    if (project->deleting) return Error(errc::changed, fmt::format("project '{}' is being deleted", name));
    out.revision = record.kvs.front().mod_revision;
  }
  Limits default_limits, own_limits;
  if (!defaults.kvs.empty()) {
    auto decoded = decode_limits(defaults.kvs.front().value);
    if (!decoded) return decoded.error().doing("the quota defaults");
    default_limits = std::move(*decoded);
  }
  if (!own.kvs.empty()) {
    auto decoded = decode_limits(own.kvs.front().value);
    if (!decoded) return decoded.error().doing(fmt::format("the quota of project '{}'", name));
    own_limits = std::move(*decoded);
  }
  out.limits = effective_limits(default_limits, own_limits);
  return out;
}

awaitable<result<ProjectStanding>> read_project(EtcdClient& etcd, const KeyLayout& keys, std::string name) {
  if (auto valid = check_project_name(name); !valid) co_return valid.error();
  std::vector<EtcdOp> reads = project_reads(keys, name);
  std::vector<EtcdCompare> always;
  auto read = co_await etcd.txn(std::move(always), std::move(reads));
  if (!read) co_return read.error();
  co_return project_standing(name, read->ranges);
}

std::optional<EtcdCompare> project_guard(const KeyLayout& keys, const ProjectStanding& project) {
  if (project.revision == 0) return std::nullopt;
  return EtcdCompare::mod_revision_is(keys.project(project.name), project.revision);
}

awaitable<result<void>> check_quota(Placement& placement, const PlacementConfig& config,
                                    const ProjectStanding& project, ProjectUsage asked, bool counted) {
  const bool limited = std::any_of(project.limits.begin(), project.limits.end(),
                                   [](const auto& limit) { return limit.second != unlimited; });
  if (!limited) co_return result<void>{};
  auto used = co_await placement.project_usage(placement_project_id(config.consumer_project, project.name));
  if (!used) co_return used.error().doing(fmt::format("the use of project '{}'", project.name));
  const ProjectUsage before = counted ? without(*used, asked) : *used;
  const auto over = over_quota(project.limits, before, asked);
  if (over.empty()) co_return result<void>{};
  co_return Error(errc::over_quota, fmt::format("project '{}' is over its quota: {}", project.name,
                                                fmt::join(over, "; ")));
}

std::string asking_user(const Config& config) {
  return config.etcd.user.empty() ? config.placement.consumer_user : config.etcd.user;
}

}  // namespace toyvm
