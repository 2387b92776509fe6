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

#include <optional>
#include <string>

namespace toyvm {

// The caller's membership, as etcd's roles for its user say it; nothing for a caller that
// reaches the cloud directly (no etcd user, root, or a user with no project role of this
// cloud). `project` chooses among several memberships (else the only one; a member's role
// goes before a reader's). Errors: permission_denied for a user of other projects only.
awaitable<result<std::optional<ProjectMembership>>> caller_membership(EtcdClient& etcd, const KeyLayout& keys,
                                                                      const EtcdConfig& config, std::string project);

// The request put in the project's keys under a lease of the caller's (kept alive while it
// waits: a command that dies withdraws it), and the service's reply once it comes (both
// erased then). not_reached when no service answered within `timeout`.
awaitable<result<ProjectReply>> ask_service(EtcdClient& etcd, const KeyLayout& keys, std::string project,
                                            ProjectRequest request, Duration timeout);

// A member's schedule as a request (the guest's data read already, into `guest`), and the
// request as the scheduler service runs it for `project`, its instances' uuids the same at
// every try of request `id`: one place for both ways, so no option is lost on the way.
ProjectRequest schedule_request(const ScheduleOptions& options, std::string user, std::string user_data,
                                std::vector<std::pair<std::string, std::string>> keys);
ScheduleOptions schedule_options(ProjectRequest request, const std::string& project, const std::string& id);

// A reply as the command's outcome: its lines said, its error returned with its exit code.
Outcome reply_outcome(const ProjectReply& reply, Say& say);

}  // namespace toyvm
