#pragma once
// toyvm's etcd key layout (documented in README.md):
//   <prefix>/hosts/<rp>              host record, attached to the agent's lease
//   <prefix>/work/<rp>/<instance>    desired state of an instance on a host
//   <prefix>/instances/<instance>    observed state of an instance
//   <prefix>/groups/<name>/<instance> server group membership: the member's host
//   <prefix>/console/<project>/<instance>/<asker>  the tail of the serial console, for one asker (under its lease)
//   <prefix>/console-requests/<rp>/<instance>/<asker>  an asker asks for it (under its lease; its
//                                    value: the instance's project)
//   <prefix>/project-console-requests/<project>/<instance>/<asker>  a project's member asks for
//                                    it; the scheduler service passes it on to the host
//   <prefix>/usage/<instance>        what the instance uses (CPU, memory, disk), while asked for
//   <prefix>/usage-requests/<rp>/<instance>  someone asks for it (under the asker's lease)
//   <prefix>/domains/<rp>/<instance> a domain the host's agent has (no value), under its lease
//   <prefix>/stats/<rp>              the host's figures (memory, disk, load), under its lease
//   <prefix>/disabled/<rp>           an operator took the host out of service, and why
//   <prefix>/claims/<instance>       a schedule is claiming for it (its hold, or under a lease)
//   <prefix>/holds/<instance>        a schedule's hold on its claims, named by its first instance
//   <prefix>/moves/<instance>        a move of the instance in flight (model/moves.hpp)
//   <prefix>/projects/<name>         a project (the default project needs none)
//   <prefix>/quotas/<name>           a project's own limits
//   <prefix>/quota-defaults          the limits of every project that sets none of its own
//   <prefix>/project-instances/<project>/<instance>  the project's view of its instance record
//   <prefix>/requests/<project>/<id> a project member's request to the scheduler service
//   <prefix>/replies/<project>/<id>  the service's answer to it
//   <prefix>/scheduler/leader        the scheduler service that acts (under its lease)
// A project's members reach only its own requests, replies and instance views (etcd's roles
// grant key ranges, so each of these is a range per project, ending in '/').

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toyvm {

class KeyLayout {
 public:
  explicit KeyLayout(std::string prefix = "/toyvm/v1");

  const std::string& prefix() const noexcept { return prefix_; }

  std::string hosts_prefix() const { return prefix_ + "/hosts/"; }
  std::string host(std::string_view rp) const;
  std::string work_root() const { return prefix_ + "/work/"; }
  std::string work_prefix(std::string_view rp) const;
  std::string work(std::string_view rp, std::string_view instance) const;
  std::string instances_prefix() const { return prefix_ + "/instances/"; }
  std::string instance(std::string_view uuid) const;
  // Each asker (named by its lease, in hex) has a request and a copy of its own: askers come
  // and go without ending each other's.
  // The copies are under the instance's project, where its members may read them.
  std::string console_prefix(std::string_view project, std::string_view uuid) const {
    return prefix_ + "/console/" + std::string(project) + "/" + std::string(uuid) + "/";
  }
  std::string console(std::string_view project, std::string_view uuid, std::string_view asker) const {
    return console_prefix(project, uuid) + std::string(asker);
  }
  std::string project_console_requests_root() const { return prefix_ + "/project-console-requests/"; }
  std::string project_console_request(std::string_view project, std::string_view uuid, std::string_view asker) const {
    return project_console_requests_root() + std::string(project) + "/" + std::string(uuid) + "/" + std::string(asker);
  }
  std::string console_requests_prefix(std::string_view rp) const {
    return prefix_ + "/console-requests/" + std::string(rp) + "/";
  }
  std::string console_request(std::string_view rp, std::string_view uuid, std::string_view asker) const {
    return console_requests_prefix(rp) + std::string(uuid) + "/" + std::string(asker);
  }
  std::string usage(std::string_view uuid) const { return prefix_ + "/usage/" + std::string(uuid); }
  std::string usage_requests_prefix(std::string_view rp) const {
    return prefix_ + "/usage-requests/" + std::string(rp) + "/";
  }
  std::string usage_request(std::string_view rp, std::string_view uuid) const {
    return usage_requests_prefix(rp) + std::string(uuid);
  }
  std::string domains_root() const { return prefix_ + "/domains/"; }
  std::string domains_prefix(std::string_view rp) const { return domains_root() + std::string(rp) + "/"; }
  std::string domain(std::string_view rp, std::string_view instance) const {
    return domains_prefix(rp) + std::string(instance);
  }
  std::string stats_prefix() const { return prefix_ + "/stats/"; }
  std::string stats(std::string_view rp) const { return stats_prefix() + std::string(rp); }
  std::string disabled_prefix() const { return prefix_ + "/disabled/"; }
  std::string disabled(std::string_view rp) const { return disabled_prefix() + std::string(rp); }
  // A schedule puts these before it claims and keeps them while it hands over; its hand-over
  // requires them. Each claim names its schedule's one hold (whose deadline alone is renewed)
  // or stands under a lease; `audit --fix` leaves a claim alone while its hold stands.
  std::string claims_prefix() const { return prefix_ + "/claims/"; }
  std::string claim(std::string_view instance) const { return claims_prefix() + std::string(instance); }
  std::string holds_prefix() const { return prefix_ + "/holds/"; }
  std::string hold(std::string_view first_instance) const { return holds_prefix() + std::string(first_instance); }
  std::string moves_prefix() const { return prefix_ + "/moves/"; }
  std::string move(std::string_view instance) const { return moves_prefix() + std::string(instance); }
  std::string projects_prefix() const { return prefix_ + "/projects/"; }
  std::string project(std::string_view name) const { return projects_prefix() + std::string(name); }
  std::string quotas_prefix() const { return prefix_ + "/quotas/"; }
  std::string quota(std::string_view project) const { return quotas_prefix() + std::string(project); }
  std::string quota_defaults() const { return prefix_ + "/quota-defaults"; }
  std::string project_instances_prefix(std::string_view project) const {
    return prefix_ + "/project-instances/" + std::string(project) + "/";
  }
  std::string project_instance(std::string_view project, std::string_view uuid) const {
    return project_instances_prefix(project) + std::string(uuid);
  }
  std::string requests_root() const { return prefix_ + "/requests/"; }
  std::string replies_root() const { return prefix_ + "/replies/"; }
  std::string requests_prefix(std::string_view project) const { return requests_root() + std::string(project) + "/"; }
  std::string request(std::string_view project, std::string_view id) const {
    return requests_prefix(project) + std::string(id);
  }
  std::string replies_prefix(std::string_view project) const { return replies_root() + std::string(project) + "/"; }
  std::string reply(std::string_view project, std::string_view id) const {
    return replies_prefix(project) + std::string(id);
  }
  std::string scheduler_leader() const { return prefix_ + "/scheduler/leader"; }
  std::string groups_root() const { return prefix_ + "/groups/"; }
  std::string group_prefix(std::string_view group) const;
  std::string group_member(std::string_view group, std::string_view instance) const;

  // A key, or with `range_end` every key from it up to that, as etcd's ranges take them.
  struct Range {
    std::string key;
    std::string range_end;

    bool operator==(const Range&) const = default;
  };
  // Every key one instance owns, as its removal erases them: its work on `host`, its record
  // and its project's view of it, its server group membership (`group` may be empty), its
  // console copies, its usage and a move in flight.
  std::vector<Range> instance_keys(std::string_view host, std::string_view uuid, std::string_view group,
                                   std::string_view project) const;
  // Where an instance's record is written, every time, in one transaction: its own key and
  // its project's view.
  std::vector<std::string> record_keys(std::string_view project, std::string_view uuid) const {
    return {instance(uuid), project_instance(project, uuid)};
  }

  struct HostInstance {
    std::string host;
    std::string instance;
  };
  // The parts of a work or domain key, or nothing for a key outside the layout.
  std::optional<HostInstance> parse_work(std::string_view key) const;
  std::optional<HostInstance> parse_domain(std::string_view key) const;
  struct GroupInstance {
    std::string group;
    std::string instance;
  };
  std::optional<GroupInstance> parse_group_member(std::string_view key) const;
  // The last segment of a key under `prefix`, or nothing.
  std::optional<std::string> leaf(std::string_view key, std::string_view prefix) const;

 private:
  std::string prefix_;
};

// Server group names: 1 to 64 of [A-Za-z0-9_.-].
bool is_group_name(std::string_view name) noexcept;

// The smallest key greater than every key that starts with `prefix`: etcd's range_end.
std::string prefix_range_end(std::string_view prefix);

}  // namespace toyvm
