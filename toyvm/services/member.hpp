#pragma once
// A command run by a project's member or reader: etcd's roles let it reach only its project's
// requests, replies and instance views, so what it asks goes to the scheduler service
// (services/scheduler_service.cpp) as a request in those keys, and what it reads comes from
// the project's views.

#include "clients/etcd.hpp"
#include "core/async.hpp"
#include "core/config.hpp"
#include "model/access.hpp"
#include "model/keys.hpp"
#include "model/requests.hpp"
#include "services/say.hpp"
#include "services/services.hpp"

#include <chrono>
#include <optional>
#include <string>

namespace toyvm {

// The caller's membership, as etcd's roles for its user say it; nothing for a caller that
// reaches the cloud directly (no etcd user, root, or a user with no project role of this
// cloud). `project` chooses among several memberships (else the only one; a member's role
// goes before a reader's). Errors: permission_denied for a user of other projects only.
awaitable<result<std::optional<ProjectMembership>>> caller_membership(EtcdClient& etcd, const KeyLayout& keys,
                                                                      const EtcdConfig& config, std::string project);

// A client that asks the service many times (a front end, a benchmark's users): one lease for
// all its requests, which it keeps alive (keep_session) and revokes at its end, and the keys of
// its last request, erased with the next one's put. Its requests then cost one etcd write each.
struct ServiceSession {
  int64_t lease = 0;
  std::vector<std::string> answered;  // the last request's keys
};

// The request put in the project's keys under a lease, and the service's reply once it
// comes. not_reached when no service answered within `timeout`. Without a session, the lease
// is the request's own, kept alive while it waits (a command that dies withdraws it) and
// revoked with the reply (the request and reply go with it).
awaitable<result<ProjectReply>> ask_service(EtcdClient& etcd, const KeyLayout& keys, std::string project,
                                            ProjectRequest request, Duration timeout,
                                            ServiceSession* session = nullptr);

// Renews `lease`, of `ttl`, until the caller stops waiting for this.
awaitable<void> keep_session(EtcdClient& etcd, int64_t lease, std::chrono::seconds ttl);

// A member's schedule as a request (the guest's data read already, into `guest`), and the
// request as the scheduler service runs it for `project`, its instances' uuids the same at
// every try of request `id`: one place for both ways, so no option is lost on the way.
ProjectRequest schedule_request(const ScheduleOptions& options, std::string user, std::string user_data,
                                std::vector<std::pair<std::string, std::string>> keys);
ScheduleOptions schedule_options(ProjectRequest request, const std::string& project, const std::string& id);

// A reply as the command's outcome: its lines said, its error returned with its exit code.
Outcome reply_outcome(const ProjectReply& reply, Say& say);

}  // namespace toyvm
