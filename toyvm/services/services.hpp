#pragma once
// One entry function per subcommand. Each runs its own event loop, says what it has to say
// through `say`, and returns its outcome; main prints an error's one line.

#include "core/config.hpp"
#include "model/records.hpp"
#include "services/say.hpp"

#include <string>
#include <vector>

namespace toyvm {

Outcome run_compute(const Config& config);
// `toyvm compute --simulate N`: N hosts in one process, each a whole agent (its provider, lease,
// host record and work) on an in-memory hypervisor, named <name>-00001... with their state
// under <state_dir>/<host>: toyvm at the size of a large cloud, on one machine.
Outcome run_simulated_hosts(const Config& config, int hosts);

struct ScheduleOptions {
  std::string query;
  std::string image;  // empty: config's default
  std::string image_sha256;  // expected digest of the image, checked by the agent
  std::string image_format;  // raw or qcow2; empty: as the image's name says
  std::string name;
  std::string policy;  // spread or pack; empty: config's
  int count = 1;       // instances placed all or nothing
  std::string availability_zone;  // becomes member_of=<the zone's aggregate>
  std::string group;              // server group name
  std::string group_policy = "anti-affinity";
  std::string user_data_file;
  std::vector<std::string> keys;       // NAME=PUBKEY
  std::vector<std::string> key_files;  // OpenSSH public key files; named by their comment
  bool config_drive = false;
  bool wait = false;
  Duration wait_timeout = std::chrono::seconds(600);
  std::string project;  // empty: the config's
  // What the scheduler service gives for a project member's request (services/scheduler_service.cpp):
  std::string user;                 // who asks; empty: the etcd user, or consumer_user
  std::string user_data;            // the guest's data, read by the member's command
  std::vector<std::pair<std::string, std::string>> named_keys;
  std::vector<std::string> uuids;   // the instances' uuids, the same for every try; empty: new ones
};
Outcome run_schedule(const Config& config, const ScheduleOptions& options, Say& say);

struct ShowOptions {
  std::string uuid;  // empty: list every instance
  bool json = false;
  bool hosts = false;
  bool console = false;  // the tail of the instance's serial console
  bool raw = false;      // ... with the guest's control characters left in
  bool follow = false;   // ... and what it prints next, until interrupted
  bool watch = false;    // each change of state as it happens, until interrupted
  Duration timeout = std::chrono::seconds(10);  // how long the instance's host has to answer (usage, console)
  std::string project;   // a member of several projects: which one's instances
};
Outcome run_show(const Config& config, const ShowOptions& options, Say& say);

struct DestroyOptions {
  std::vector<std::string> uuids;  // destroyed side by side
  bool force = false;  // the host is gone for good: release and remove without it
  bool wait = true;
  Duration wait_timeout = std::chrono::seconds(120);
};
Outcome run_destroy(const Config& config, const DestroyOptions& options, Say& say);

struct PowerOptions {
  std::string uuid;
  PowerState power = PowerState::running;  // running (toyvm start) or stopped (toyvm stop)
  bool wait = true;
  Duration wait_timeout = std::chrono::seconds(120);
};
Outcome run_power(const Config& config, const PowerOptions& options, Say& say);

struct AuditOptions {
  bool json = false;
  bool fix = false;      // repair what is unambiguous, once seen again after the grace period
  Duration grace = std::chrono::seconds(10);
  Duration move_deadline = std::chrono::seconds(3600);  // a move in flight longer is a finding
};
Outcome run_audit(const Config& config, const AuditOptions& options, Say& say);

struct MigrateOptions {
  std::string uuid;
  std::string host;  // the destination's name or provider uuid; empty: chosen as a schedule would
  bool cold = false;  // powered off, its disk copied (a stopped instance always is)
  bool abort = false;  // its move in flight undone instead
  std::string resize_to;  // toyvm resize: its new placement query (cold; its own host allowed)
  bool wait = true;
  Duration wait_timeout = std::chrono::seconds(600);
};
// toyvm migrate and toyvm resize.
Outcome run_migrate(const Config& config, const MigrateOptions& options, Say& say);

struct HostOptions {
  enum class Action { disable, enable, drain };
  std::string host;     // its name or provider uuid
  Action action = Action::disable;
  std::string reason;   // why it is disabled, shown by `show --hosts`
  int parallel = 1;     // drain: moves at once
  Duration move_timeout = std::chrono::seconds(600);  // drain: for each move
};
Outcome run_host(const Config& config, const HostOptions& options, Say& say);

struct ProjectOptions {
  enum class Action { create, list, show, set, remove, add_member, remove_member };
  Action action = Action::list;
  std::string name;
  std::string user;           // add-member, remove-member: etcd's user (its certificate's CN)
  std::string role = "member";  // add-member: member or reader
  std::string password_file;  // add-member: the user's password, else it signs in by certificate
  std::vector<std::string> limits;  // NAME=N, NAME=unlimited, NAME=default
  bool defaults = false;            // set: the defaults of every project without its own
  bool json = false;
};
Outcome run_project(const Config& config, const ProjectOptions& options, Say& say);

// toyvm evacuate: a dead host's instances rebuilt elsewhere.
Outcome run_evacuate(const Config& config, const std::string& host, Say& say);

struct MdserverOptions {
  std::vector<std::string> listen;  // ADDRESS:PORT; empty: config's
};
Outcome run_mdserver(const Config& config, const MdserverOptions& options);

// toyvm scheduler: the service that claims and hands over for projects' members.
struct SchedulerServiceOptions {
  std::string name;  // who leads, as `scheduler/leader` says; default the host name and pid
};
Outcome run_scheduler_service(const Config& config, const SchedulerServiceOptions& options);

}  // namespace toyvm
