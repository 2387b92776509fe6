// toyvm project create / list / show / set / delete: the projects that share the cloud and
// their quotas. A project is a record in etcd (`projects/<name>`, none for the default
// project), its limits are another (`quotas/<name>`, over `quota-defaults`), and its use is
// what Placement counts for it. Deleting one marks it first, so that no schedule that read it
// before can hand an instance into it afterwards (their hand-overs require its record as they
// read it), then looks for its instances, and deletes it only when it has none.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "model/access.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "services/common.hpp"
#include "services/quota.hpp"
#include "services/services.hpp"

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <set>

namespace toyvm {
namespace {

namespace json = boost::json;

std::string limit_text(int64_t limit) { return limit == unlimited ? "unlimited" : std::to_string(limit); }

std::string limits_text(const Limits& limits) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : limits) parts.push_back(fmt::format("{}={}", name, limit_text(value)));
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ","));
}

class ProjectAdmin {
 public:
  ProjectAdmin(asio::io_context& io, const Config& config, const ProjectOptions& options, Say& say)
      : config_(config),
        options_(options),
        say_(say),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        placement_(io.get_executor(), config.placement) {}

  awaitable<Outcome> run() {
    auto done = co_await act();
    if (!done) co_return with_endpoints(*etcd_, done.error());
    co_return *done;
  }

 private:
  awaitable<Outcome> act() {
    using Action = ProjectOptions::Action;
    if (options_.action == Action::list) co_return co_await list();
    if (options_.action == Action::set && options_.defaults) {
      std::string defaults;  // no project: the defaults
      co_return co_await set_limits(std::move(defaults));
    }
    if (!is_project_name(options_.name))
      co_return Error(errc::invalid_argument, fmt::format("bad project name '{}' (1 to 32 of a-z 0-9 - _, starting "
                                                          "with a letter or digit)",
                                                          options_.name));
    switch (options_.action) {
      case Action::create: co_return co_await create();
      case Action::show: co_return co_await show();
      case Action::set: co_return co_await set_limits(options_.name);
      case Action::remove: co_return co_await remove();
      case Action::add_member: co_return co_await add_member();
      case Action::remove_member: co_return co_await remove_member();
      case Action::list: break;
    }
    co_return ExitCode::ok;
  }

  result<std::vector<LimitSetting>> settings() const {
    std::vector<LimitSetting> out;
    for (const std::string& text : options_.limits) {
      auto setting = parse_limit_setting(text);
      if (!setting) return setting.error();
      out.push_back(std::move(*setting));
    }
    return out;
  }

  awaitable<Outcome> create() {
    const std::string& name = options_.name;
    if (name == default_project) co_return Error(errc::already_exists, "project 'default' always exists");
    auto wanted = settings();
    if (!wanted) co_return wanted.error();
    Limits limits;
    for (const LimitSetting& s : *wanted)
      if (s.value) limits[s.name] = *s.value;
    std::vector<EtcdOp> writes{EtcdOp::put(keys_.project(name), encode(ProjectRecord{unix_seconds(), false}))};
    if (!limits.empty()) writes.push_back(EtcdOp::put(keys_.quota(name), encode_limits(limits)));
    // Limits a deleted project of that name left (a delete cut short) do not carry over.
    if (limits.empty()) writes.push_back(EtcdOp::erase(keys_.quota(name)));
    std::vector<EtcdCompare> unmade{EtcdCompare::absent(keys_.project(name))};
    auto made = co_await etcd_->txn(std::move(unmade), std::move(writes));
    if (!made) co_return made.error();
    if (!made->succeeded) co_return Error(errc::already_exists, fmt::format("project '{}' exists", name));
    say_.line(fmt::format("CREATED PROJECT {} (limits: {})", name, limits_text(limits)));
    co_return ExitCode::ok;
  }

  // Its own limits (or the defaults, `name` empty) changed as asked, under the revision read.
  awaitable<Outcome> set_limits(std::string name) {
    auto wanted = settings();
    if (!wanted) co_return wanted.error();
    if (wanted->empty()) co_return Error(errc::invalid_argument, "nothing to set: give --limit NAME=N");
    const std::string key = name.empty() ? keys_.quota_defaults() : keys_.quota(name);
    for (int attempt = 0; attempt < 8; ++attempt) {
      std::vector<EtcdOp> reads{EtcdOp::get(key)};
      if (!name.empty() && name != default_project) reads.push_back(EtcdOp::get(keys_.project(name)));
      std::vector<EtcdCompare> always;
      auto read = co_await etcd_->txn(std::move(always), std::move(reads));
      if (!read) co_return read.error();
      if (read->ranges.size() > 1 && read->ranges[1].kvs.empty())
        co_return Error(errc::not_found, fmt::format("unknown project '{}'", name));
      Limits limits;
      std::vector<EtcdCompare> guard{EtcdCompare::absent(key)};
      if (!read->ranges[0].kvs.empty()) {
        const KeyValue& kv = read->ranges[0].kvs.front();
        auto decoded = decode_limits(kv.value);
        if (!decoded) co_return decoded.error().doing(key);
        limits = std::move(*decoded);
        guard = {EtcdCompare::mod_revision_is(key, kv.mod_revision)};
      }
      if (read->ranges.size() > 1) guard.push_back(EtcdCompare::present(keys_.project(name)));
      for (const LimitSetting& s : *wanted) {
        if (s.value) {
          limits[s.name] = *s.value;
        } else {
          limits.erase(s.name);
        }
      }
      std::vector<EtcdOp> put{EtcdOp::put(key, encode_limits(limits))};
      auto written = co_await etcd_->txn(std::move(guard), std::move(put));
      if (!written) co_return written.error();
      if (!written->succeeded) continue;  // changed meanwhile: read again
      say_.line(name.empty() ? fmt::format("SET QUOTA DEFAULTS: {}", limits_text(limits))
                             : fmt::format("SET QUOTA OF PROJECT {}: {}", name, limits_text(limits)));
      co_return ExitCode::ok;
    }
    co_return Error(errc::changed, fmt::format("{} kept changing; nothing set", key));
  }

  awaitable<Outcome> show() {
    auto project = co_await read_project(*etcd_, keys_, options_.name);
    const bool deleting = !project && project.error() == errc::changed;
    if (!project && !deleting) co_return project.error();
    Limits limits = project ? project->limits : Limits{};
    auto used = co_await placement_.project_usage(placement_project_id(config_.placement.consumer_project,
                                                                       options_.name));
    if (!used) co_return used.error();
    if (options_.json) {
      json::object limits_json, used_json{{"instances", used->instances}};
      for (const auto& [n, v] : limits) limits_json[n] = v;
      for (const auto& [rc, v] : used->amounts) used_json[rc] = v;
      say_.line(json::serialize(json::object{{"name", options_.name},
                                             {"placement_project_id", placement_project_id(
                                                                          config_.placement.consumer_project,
                                                                          options_.name)},
                                             {"deleting", deleting},
                                             {"limits", std::move(limits_json)},
                                             {"used", std::move(used_json)}}));
      co_return ExitCode::ok;
    }
    say_.line(fmt::format("project {}{}", options_.name, deleting ? " (being deleted)" : ""));
    auto row = [&](const std::string& what, int64_t now) {
      auto limit = limits.find(what);
      say_.line(fmt::format("  {:<12} {} / {}", what, now, limit == limits.end() ? "unlimited" : limit_text(limit->second)));
    };
    row(std::string(instances_limit), used->instances);
    std::set<std::string> classes;
    for (const auto& [rc, v] : used->amounts) classes.insert(rc);
    for (const auto& [n, v] : limits)
      if (n != instances_limit) classes.insert(n);
    for (const std::string& rc : classes) {
      auto now = used->amounts.find(rc);
      row(rc, now == used->amounts.end() ? 0 : now->second);
    }
    co_return ExitCode::ok;
  }

  // Every project, its records and limits read in one transaction; its use from Placement.
  awaitable<Outcome> list() {
    std::vector<EtcdOp> reads{EtcdOp::get(keys_.projects_prefix(), prefix_range_end(keys_.projects_prefix())),
                              EtcdOp::get(keys_.quotas_prefix(), prefix_range_end(keys_.quotas_prefix())),
                              EtcdOp::get(keys_.quota_defaults())};
    std::vector<EtcdCompare> always;
    auto read = co_await etcd_->txn(std::move(always), std::move(reads));
    if (!read) co_return read.error();
    std::map<std::string, std::string> state{{std::string(default_project), ""}};  // name -> what hinders it
    for (const KeyValue& kv : read->ranges[0].kvs) {
      auto name = keys_.leaf(kv.key, keys_.projects_prefix());
      if (!name || !is_project_name(*name)) continue;
      auto record = decode_project(kv.value);
      state[*name] = !record ? "(unreadable)" : record->deleting ? "(being deleted)" : "";
    }
    std::map<std::string, Limits> own;
    for (const KeyValue& kv : read->ranges[1].kvs) {
      auto name = keys_.leaf(kv.key, keys_.quotas_prefix());
      auto limits = decode_limits(kv.value);
      if (!name || !state.count(*name)) continue;
      if (limits) own[*name] = std::move(*limits);
      else state[*name] = "(unreadable)";
    }
    Limits defaults;
    if (!read->ranges[2].kvs.empty())
      if (auto decoded = decode_limits(read->ranges[2].kvs.front().value)) defaults = std::move(*decoded);
    say_.line(fmt::format("{:<32} {:>9}  {}", "PROJECT", "INSTANCES", "LIMITS"));
    for (const auto& [name, hindered] : state) {
      auto used = co_await placement_.project_usage(placement_project_id(config_.placement.consumer_project, name));
      if (!used) co_return used.error();
      const std::string limits = hindered.empty() ? limits_text(effective_limits(defaults, own[name])) : hindered;
      say_.line(fmt::format("{:<32} {:>9}  {}", name, used->instances, limits));
    }
    say_.line(fmt::format("defaults: {}", limits_text(defaults)));
    co_return ExitCode::ok;
  }

  awaitable<Outcome> remove() {
    const std::string& name = options_.name;
    if (name == default_project) co_return Error(errc::invalid_argument, "the default project cannot be deleted");
    auto read = co_await etcd_->range(keys_.project(name));
    if (!read) co_return read.error();
    if (read->kvs.empty()) co_return Error(errc::not_found, fmt::format("unknown project '{}'", name));
    auto record = decode_project(read->kvs.front().value);
    if (!record) co_return record.error().doing(fmt::format("project '{}'", name));
    // Marked first: a hand-over into it that was decided before now is refused from here on.
    record->deleting = true;
    std::vector<EtcdCompare> as_read{EtcdCompare::mod_revision_is(keys_.project(name), read->kvs.front().mod_revision)};
    std::vector<EtcdOp> mark_it{EtcdOp::put(keys_.project(name), encode(*record))};
    auto marked = co_await etcd_->txn(std::move(as_read), std::move(mark_it));
    if (!marked) co_return marked.error();
    if (!marked->succeeded) co_return Error(errc::changed, fmt::format("project '{}' changed meanwhile; nothing deleted", name));
    const int64_t mark = marked->revision;
    auto left = co_await instances_of(name);
    if (!left || *left > 0) {
      // Not deleted: the mark goes again, if it is still ours.
      record->deleting = false;
      std::vector<EtcdCompare> still_marked{EtcdCompare::mod_revision_is(keys_.project(name), mark)};
      std::vector<EtcdOp> unmark{EtcdOp::put(keys_.project(name), encode(*record))};
      co_await etcd_->txn(std::move(still_marked), std::move(unmark));
      if (!left) co_return left.error();
      co_return Error(errc::already_exists,
                      fmt::format("project '{}' still has {} instance(s); destroy them first", name, *left));
    }
    std::vector<EtcdCompare> marked_by_us{EtcdCompare::mod_revision_is(keys_.project(name), mark)};
    std::vector<EtcdOp> erase{EtcdOp::erase(keys_.project(name)), EtcdOp::erase(keys_.quota(name))};
    auto erased = co_await etcd_->txn(std::move(marked_by_us), std::move(erase));
    if (!erased) co_return erased.error();
    if (!erased->succeeded) co_return Error(errc::changed, fmt::format("project '{}' changed meanwhile; nothing deleted", name));
    // Its roles go too: whoever held them reaches nothing of a project of the same name later.
    for (ProjectRole role : {ProjectRole::member, ProjectRole::reader})
      if (auto gone = co_await etcd_->role_delete(etcd_role_name(keys_, name, role));
          !gone && gone.error() != errc::not_found && gone.error() != errc::etcd_error)
        co_return gone.error().doing("deleting the project's roles");
    say_.line(fmt::format("DELETED PROJECT {}", name));
    co_return ExitCode::ok;
  }

  // The user gets the project's role in etcd (made, with its grants, the first time): etcd
  // itself then lets it reach the project's keys and nothing else.
  awaitable<Outcome> add_member() {
    const std::string& name = options_.name;
    auto role = parse_project_role(options_.role);
    if (!role) co_return Error(errc::invalid_argument, fmt::format("bad role '{}' (member or reader)", options_.role));
    if (options_.user.empty() || options_.user == "root")
      co_return Error(errc::invalid_argument, "give the member's etcd user name (not root)");
    auto project = co_await read_project(*etcd_, keys_, name);
    if (!project) co_return project.error();
    std::string password;
    if (!options_.password_file.empty()) {
      std::ifstream in(options_.password_file);
      if (!in || !std::getline(in, password) || password.empty())
        co_return Error(errc::invalid_argument, fmt::format("cannot read a password from {}", options_.password_file));
    }
    const std::string role_name = etcd_role_name(keys_, name, *role);
    // Each step may have been made by an earlier try: what exists is taken as it is.
    if (auto made = co_await etcd_->role_add(role_name); !made && made.error() != errc::already_exists)
      co_return made.error().doing("making the project's role in etcd");
    for (KeyGrant& grant : project_grants(keys_, name, *role)) {
      EtcdPermission permission{grant.write ? EtcdPermission::Type::readwrite : EtcdPermission::Type::read,
                                std::move(grant.key), std::move(grant.range_end)};
      if (auto granted = co_await etcd_->role_grant(role_name, std::move(permission)); !granted)
        co_return granted.error().doing("granting the project's keys to its role");
    }
    if (auto added = co_await etcd_->user_add(options_.user, password); !added && added.error() != errc::already_exists)
      co_return added.error().doing(fmt::format("adding user {} to etcd", options_.user));
    if (auto granted = co_await etcd_->user_grant_role(options_.user, role_name); !granted)
      co_return granted.error().doing(fmt::format("granting user {} the role", options_.user));
    say_.line(fmt::format("ADDED {} TO PROJECT {} AS {}", options_.user, name, to_string(*role)));
    co_return ExitCode::ok;
  }

  awaitable<Outcome> remove_member() {
    bool had = false;
    for (ProjectRole role : {ProjectRole::member, ProjectRole::reader}) {
      auto revoked = co_await etcd_->user_revoke_role(options_.user, etcd_role_name(keys_, options_.name, role));
      if (revoked) had = true;
      else if (revoked.error() != errc::not_found) co_return revoked.error();
    }
    if (!had)
      co_return Error(errc::not_found, fmt::format("user {} is not in project {}", options_.user, options_.name));
    say_.line(fmt::format("REMOVED {} FROM PROJECT {}", options_.user, options_.name));
    co_return ExitCode::ok;
  }

  // Its instances as etcd records them, or as Placement counts them, whichever says more: an
  // instance whose record cannot be read is one. Unknown is an error, never none.
  awaitable<result<int64_t>> instances_of(std::string name) {
    auto records = co_await etcd_->range_prefix(keys_.instances_prefix());
    if (!records) co_return records.error();
    int64_t recorded = 0;
    for (const KeyValue& kv : records->kvs) {
      auto record = decode_instance(kv.value);
      if (!record || record->project == name) ++recorded;
    }
    auto used = co_await placement_.project_usage(placement_project_id(config_.placement.consumer_project, name));
    if (!used) co_return used.error();
    co_return std::max(recorded, used->instances);
  }

  const Config& config_;
  const ProjectOptions& options_;
  Say& say_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  PlacementClient placement_;
};

}  // namespace

Outcome run_project(const Config& config, const ProjectOptions& options, Say& say) {
  return run_on_loop([&](asio::io_context& io) -> awaitable<Outcome> {
    ProjectAdmin admin(io, config, options, say);
    co_return co_await admin.run();
  });
}

}  // namespace toyvm
