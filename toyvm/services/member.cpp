#include "services/member.hpp"

#include "model/projects.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>

#include <algorithm>

namespace toyvm {

using namespace asio::experimental::awaitable_operators;

namespace {

constexpr int64_t request_ttl_s = 15;

}  // namespace

awaitable<void> keep_session(EtcdClient& etcd, int64_t lease, std::chrono::seconds ttl) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  std::unique_ptr<EtcdLeaseKeeper> keeper = etcd.keep_alive(lease);
  while (true) {
    timer.expires_after(ttl / 3);
    co_await timer.async_wait(use_awaitable);
    auto left = co_await keeper->ping();
    if (!left || *left == 0) keeper = etcd.keep_alive(lease);
  }
}

awaitable<result<std::optional<ProjectMembership>>> caller_membership(EtcdClient& etcd, const KeyLayout& keys,
                                                                      const EtcdConfig& config, std::string project) {
  using Found = std::optional<ProjectMembership>;
  if (config.user.empty() || config.user == "root") co_return Found{};
  auto roles = co_await etcd.user_roles(config.user);
  if (!roles && roles.error() == errc::not_found)
    co_return Error(errc::permission_denied, fmt::format("etcd knows no user {}: it is in no project, and not the "
                                                         "cloud's admin",
                                                         config.user));
  if (!roles) co_return roles.error().doing(fmt::format("reading the roles of etcd user {}", config.user));
  std::vector<ProjectMembership> memberships;
  for (const std::string& role : *roles) {
    if (role == "root") co_return Found{};
    if (auto membership = parse_etcd_role(keys, role)) memberships.push_back(std::move(*membership));
  }
  if (memberships.empty()) co_return Found{};
  std::optional<ProjectMembership> chosen;
  for (const ProjectMembership& m : memberships) {
    if (!project.empty() && m.project != project) continue;
    if (chosen && chosen->project != m.project)
      co_return Error(errc::invalid_argument, fmt::format("etcd user {} is in several projects: say which (--project)",
                                                          config.user));
    if (!chosen || m.role == ProjectRole::member) chosen = m;
  }
  if (!chosen)
    co_return Error(errc::permission_denied, fmt::format("etcd user {} is not in project {}", config.user, project));
  co_return chosen;
}

awaitable<result<ProjectReply>> ask_service(EtcdClient& etcd, const KeyLayout& keys, std::string project,
                                            ProjectRequest request, Duration timeout, ServiceSession* session) {
  const std::string id = new_uuid();
  const std::string request_key = keys.request(project, id), reply_key = keys.reply(project, id);
  auto lease = session ? result<int64_t>(session->lease) : co_await etcd.lease_grant(request_ttl_s);
  if (!lease) co_return lease.error();
  std::vector<EtcdCompare> fresh{EtcdCompare::absent(request_key)};
  std::vector<EtcdOp> put{EtcdOp::put(request_key, encode(request), *lease)};
  if (session)
    for (const std::string& key : session->answered) put.push_back(EtcdOp::erase(key));
  auto asked = co_await etcd.txn(std::move(fresh), std::move(put));
  if (session) {
    // Its keys are erased with the next put, this one's too if etcd did not say it is not there.
    if (asked) session->answered.clear();
    session->answered.insert(session->answered.end(), {request_key, reply_key});
  }
  if (!asked) co_return asked.error().doing("asking the scheduler service");
  std::optional<ProjectReply> reply;
  Error unreadable;
  auto seen = [&](const WatchEvent& event) {
    if (event.type != WatchEvent::Type::put) return false;
    auto decoded = decode_reply(event.kv.value);
    if (decoded) reply = std::move(*decoded);
    else unreadable = decoded.error();
    return true;
  };
  const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  std::function<bool(const WatchEvent&)> seen_reply = seen;  // made outside co_await (GCC 12)
  result<bool> followed = false;
  if (session) {
    followed = co_await follow_key(etcd, reply_key, asked->revision + 1, wait_ms, std::move(seen_reply));
    // Not answered in time: withdrawn now, while still unanswered (the service hands over only
    // a request that stands); answered meanwhile, its answer is the outcome.
    if (!followed || !*followed) {
      std::vector<EtcdCompare> unanswered{EtcdCompare::absent(reply_key)};
      std::vector<EtcdOp> withdraw{EtcdOp::erase(request_key)}, read{EtcdOp::get(reply_key)};
      auto withdrawn = co_await etcd.txn(std::move(unanswered), std::move(withdraw), std::move(read));
      if (withdrawn && !withdrawn->succeeded && !withdrawn->ranges.empty() && !withdrawn->ranges[0].kvs.empty()) {
        seen(WatchEvent{WatchEvent::Type::put, withdrawn->ranges[0].kvs.front(), {}});
        followed = true;
      } else if (!withdrawn) {
        co_return withdrawn.error().doing("withdrawing a request the scheduler service did not answer in time; it "
                                          "stands until the session ends");
      }
    }
  } else {
    const std::chrono::seconds ttl(request_ttl_s);
    auto waited = co_await (follow_key(etcd, reply_key, asked->revision + 1, wait_ms, std::move(seen_reply)) ||
                            keep_session(etcd, *lease, ttl));
    // The request and its reply go with the lease, revoked at once (or, if etcd does not
    // answer now, when it expires).
    co_await etcd.lease_revoke(*lease);
    followed = std::get<0>(std::move(waited));
  }
  if (!followed) co_return followed.error();
  if (!*followed)
    co_return Error(errc::not_reached, fmt::format("no scheduler service answered within {:g} s (is `toyvm scheduler` "
                                                   "running?); the request is withdrawn",
                                                   in_seconds(timeout)));
  if (!reply) co_return unreadable.doing("the scheduler service's reply");
  co_return std::move(*reply);
}

ProjectRequest schedule_request(const ScheduleOptions& options, std::string user, std::string user_data,
                                std::vector<std::pair<std::string, std::string>> keys) {
  ProjectRequest r;
  r.action = RequestAction::schedule;
  r.user = std::move(user);
  r.query = options.query;
  r.count = std::max(1, options.count);
  r.name = options.name;
  r.image = options.image;
  r.image_sha256 = options.image_sha256;
  r.image_format = options.image_format;
  r.availability_zone = options.availability_zone;
  r.group = options.group;
  if (!options.group.empty()) r.group_policy = options.group_policy;
  r.policy = options.policy;
  r.user_data = std::move(user_data);
  r.keys = std::move(keys);
  r.config_drive = options.config_drive;
  r.asked_at = unix_millis();
  return r;
}

ScheduleOptions schedule_options(ProjectRequest r, const std::string& project, const std::string& id) {
  ScheduleOptions o;
  o.query = std::move(r.query);
  o.count = r.count;
  o.name = std::move(r.name);
  o.image = std::move(r.image);
  o.image_sha256 = std::move(r.image_sha256);
  o.image_format = std::move(r.image_format);
  o.availability_zone = std::move(r.availability_zone);
  o.group = std::move(r.group);
  if (!r.group_policy.empty()) o.group_policy = std::move(r.group_policy);
  o.policy = std::move(r.policy);
  o.user_data = std::move(r.user_data);
  o.named_keys = std::move(r.keys);
  o.config_drive = r.config_drive;
  o.project = project;
  o.user = r.user.empty() ? "unknown" : std::move(r.user);
  for (int i = 0; i < o.count; ++i) o.uuids.push_back(request_instance_uuid(id, i));
  return o;
}

Outcome reply_outcome(const ProjectReply& reply, Say& say) {
  for (const std::string& line : reply.lines) say.line(line);
  // An answer (0, NO ALLOCATIONS LEFT) is its exit code; an error keeps its category's.
  if (reply.error.empty()) return static_cast<ExitCode>(reply.exit_code);
  errc code = errc::changed;
  switch (static_cast<ExitCode>(reply.exit_code)) {
    case ExitCode::no_allocations: code = errc::no_allocations_left; break;
    case ExitCode::usage: code = errc::invalid_argument; break;
    case ExitCode::not_found: code = errc::not_found; break;
    case ExitCode::unavailable: code = errc::placement_unavailable; break;
    case ExitCode::no_address: code = errc::no_address; break;
    case ExitCode::over_quota: code = errc::over_quota; break;
    default: break;
  }
  return Error(code, reply.error);
}

}  // namespace toyvm
