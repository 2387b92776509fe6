#include "commands.hpp"

#include "services/services.hpp"

#include <fmt/format.h>

#include <memory>

namespace toyvm {
namespace {

// A duration option, written in seconds (decimals allowed), held as a Duration.
void add_seconds(CLI::App& command, const std::string& name, Duration& target, const std::string& help) {
  auto set = [&target](double seconds) { target = from_seconds(seconds); };
  command.add_option_function<double>(name, set, help)
      ->check(CLI::NonNegativeNumber)
      ->default_str(fmt::format("{:g}", in_seconds(target)));
}

// Each command's options are held by its entry (a shared_ptr the returned lambda keeps), which
// reads them after parsing.
CommandEntry compute(CLI::App& command) {
  struct Overrides {
    std::string state_dir, libvirt_uri, inventory, name, zone;
    std::vector<std::string> traits;
    int max_instances = -1;
    int simulate = 0;
  };
  auto o = std::make_shared<Overrides>();
  command.add_option("--state-dir", o->state_dir, "where the provider uuid and instances live");
  command.add_option("--libvirt-uri", o->libvirt_uri, "libvirt connection URI, e.g. qemu:///system");
  command.add_option("--inventory", o->inventory, "inventory instead of measuring, e.g. VCPU:4,DISK_GB:10,MEMORY_MB:512");
  command.add_option("--name", o->name, "provider name (default: the host name)");
  command.add_option("--trait", o->traits, "a trait to report, e.g. CUSTOM_GPU (repeatable)");
  command.add_option("--az", o->zone, "availability zone (a Placement aggregate)");
  command.add_option("--max-instances", o->max_instances, "report FULL at this many instances (0: no limit)");
  command.add_option("--simulate", o->simulate,
                     "run N simulated hosts in this process (in-memory hypervisors, --inventory each; --name "
                     "is their prefix)")
      ->check(CLI::Range(1, 100000));
  command.footer("Example: toyvm compute --state-dir /var/lib/toyvm --libvirt-uri qemu:///system");
  return [o](const Config& base, Say&) {
    Config config = base;
    ComputeConfig& c = config.compute;
    if (!o->state_dir.empty()) c.state_dir = o->state_dir;
    if (!o->libvirt_uri.empty()) c.libvirt_uri = o->libvirt_uri;
    if (!o->inventory.empty()) c.inventory = o->inventory;
    if (!o->name.empty()) c.name = o->name;
    if (!o->traits.empty()) c.traits = o->traits;
    if (!o->zone.empty()) c.availability_zone = o->zone;
    if (o->max_instances >= 0) c.max_instances = o->max_instances;
    if (o->simulate > 0) return run_simulated_hosts(config, o->simulate);
    return run_compute(config);
  };
}

CommandEntry schedule(CLI::App& command) {
  auto o = std::make_shared<ScheduleOptions>();
  command.add_option("query", o->query, "Placement query, e.g. 'resources=VCPU:1,MEMORY_MB:256'")->required();
  command.add_option("--image", o->image, "image: a name in the agents' image dir, or an http(s) or file URL");
  command.add_option("--image-sha256", o->image_sha256, "the image's expected SHA-256 (hex)");
  command.add_option("--image-format", o->image_format, "raw or qcow2, for an image whose name does not say")
      ->check(CLI::IsMember({"raw", "qcow2"}));
  command.add_option("--az", o->availability_zone, "only hosts in this availability zone");
  command.add_option("--group", o->group, "server group to join");
  command.add_option("--group-policy", o->group_policy, "affinity, anti-affinity (default) or soft-anti-affinity")
      ->check(CLI::IsMember({"affinity", "anti-affinity", "soft-anti-affinity"}));
  command.add_option("--count", o->count, "place this many instances, all or nothing")->check(CLI::Range(1, 10000));
  command.add_option("--policy", o->policy, "host weighing: spread (default) or pack")
      ->check(CLI::IsMember({"spread", "pack"}));
  command.add_option("--name", o->name, "instance name (also its hostname)");
  command.add_option("--user-data", o->user_data_file, "file given to cloud-init as user data");
  command.add_option("--key", o->keys, "ssh public key as NAME=PUBKEY (repeatable)");
  command.add_option("--key-file", o->key_files, "ssh public key file (repeatable)");
  command.add_flag("--config-drive", o->config_drive,
                   "give the guest its metadata on a config drive too (for networks without 169.254.169.254)");
  command.add_flag("--wait", o->wait, "wait for ACTIVE (and the guest IP, with a NIC) or ERROR, printing each state");
  add_seconds(command, "--timeout", o->wait_timeout, "seconds to --wait");
  command.add_option("--project", o->project, "the instances' project (default: [schedule] project, \"default\")");
  command.footer("Exit 7 when the project's quota cannot take the instances.\n"
                 "Example: toyvm schedule 'resources=VCPU:1,DISK_GB:1,MEMORY_MB:256' --wait");
  return [o](const Config& c, Say& say) { return run_schedule(c, *o, say); };
}

CommandEntry show(CLI::App& command) {
  auto o = std::make_shared<ShowOptions>();
  command.add_option("uuid", o->uuid, "instance uuid (omit to list every instance)");
  command.add_flag("--json", o->json, "print JSON");
  command.add_flag("--hosts", o->hosts, "list the compute hosts");
  auto* console = command.add_flag(
      "--console", o->console, "print the tail of the instance's serial console, control characters shown as ^X");
  command.add_flag("--raw", o->raw, "with --console: the guest's bytes as they are, escape sequences too")
      ->needs(console);
  command.add_flag("--follow", o->follow, "with --console: keep printing what the guest writes, until interrupted")
      ->needs(console);
  command
      .add_flag("--watch", o->watch,
                "print each change of an instance's state (or every instance's) as it happens, a line each "
                "(--json: an object each), until interrupted")
      ->excludes(console);
  add_seconds(command, "--timeout", o->timeout, "seconds the instance's host has to answer (its usage, its console)");
  command.add_option("--project", o->project, "for a member of several projects: which one's instances");
  command.footer("Example: toyvm show d578fb7c-7787-4e73-b69a-a7b3ef9bf73a --json");
  return [o](const Config& c, Say& say) { return run_show(c, *o, say); };
}

// --no-wait, for a command that waits by default.
void add_no_wait(CLI::App& command, bool& wait, const char* help) {
  command.add_flag_callback("--no-wait", [&wait] { wait = false; }, help);
}

CommandEntry destroy(CLI::App& command) {
  auto o = std::make_shared<DestroyOptions>();
  command.add_option("uuids", o->uuids, "instance uuids, destroyed side by side")->required();
  add_no_wait(command, o->wait, "return once the requests are recorded");
  command.add_flag("--force", o->force, "the host is gone for good: release the allocation and remove the keys here");
  add_seconds(command, "--timeout", o->wait_timeout, "seconds to wait for the host");
  command.footer("Each instance's failure is told; the exit code is the first's, in the order given.\n"
                 "Example: toyvm destroy d578fb7c-7787-4e73-b69a-a7b3ef9bf73a");
  return [o](const Config& c, Say& say) { return run_destroy(c, *o, say); };
}

CommandEntry power(CLI::App& command, PowerState to) {
  auto o = std::make_shared<PowerOptions>();
  o->power = to;
  command.add_option("uuid", o->uuid, "instance uuid")->required();
  add_no_wait(command, o->wait, "return once the request is recorded");
  add_seconds(command, "--timeout", o->wait_timeout, "seconds to wait for the host");
  return [o](const Config& c, Say& say) { return run_power(c, *o, say); };
}

CommandEntry start(CLI::App& command) { return power(command, PowerState::running); }
CommandEntry stop(CLI::App& command) { return power(command, PowerState::stopped); }

CommandEntry audit(CLI::App& command) {
  auto o = std::make_shared<AuditOptions>();
  command.add_flag("--json", o->json, "print JSON");
  command.add_flag("--fix", o->fix,
                   "release allocations nobody owns or an ERROR instance holds, drop members of gone instances; each "
                   "only when seen again after --grace seconds");
  add_seconds(command, "--grace", o->grace, "seconds between the two looks of --fix");
  add_seconds(command, "--move-deadline", o->move_deadline,
              "seconds a move may be in flight before it is a finding (move_overdue)");
  command.footer("Exit 0 when everything agrees, 1 when something does not (after --fix: is still not).\n"
                 "Example: toyvm audit --fix");
  return [o](const Config& c, Say& say) { return run_audit(c, *o, say); };
}

CommandEntry migrate(CLI::App& command) {
  auto o = std::make_shared<MigrateOptions>();
  command.add_option("uuid", o->uuid, "instance uuid")->required();
  command.add_option("--host", o->host,
                     "destination host name or provider uuid (default: the best other host for its query)");
  add_no_wait(command, o->wait, "return once the move is asked for");
  command.add_flag("--cold", o->cold, "power it off, copy its disk, start it there (a stopped one stays off)");
  command.add_flag("--abort", o->abort, "undo its move in flight (a live send running is aborted); it stays where it was");
  add_seconds(command, "--timeout", o->wait_timeout, "seconds to wait for the move");
  command.footer("Its disk and memory are copied while it runs; it keeps its uuid, MAC and address.\n"
                 "A stopped instance moves cold, and stays stopped.\n"
                 "Example: toyvm migrate d578fb7c-7787-4e73-b69a-a7b3ef9bf73a --host compute-2");
  return [o](const Config& c, Say& say) { return run_migrate(c, *o, say); };
}

CommandEntry resize(CLI::App& command) {
  auto o = std::make_shared<MigrateOptions>();
  command.add_option("uuid", o->uuid, "instance uuid")->required();
  command.add_option("query", o->resize_to, "its new placement query, e.g. 'resources=VCPU:2,MEMORY_MB:512,DISK_GB:2'")
      ->required();
  command.add_option("--host", o->host, "destination host name or provider uuid (its own allowed)");
  add_no_wait(command, o->wait, "return once the resize is asked for");
  add_seconds(command, "--timeout", o->wait_timeout, "seconds to wait for the resize");
  command.footer("Its disk grows with DISK_GB and never shrinks; it keeps its uuid, MAC, address and disk\n"
                 "contents, and its power state.\n"
                 "Example: toyvm resize d578fb7c-7787-4e73-b69a-a7b3ef9bf73a 'resources=VCPU:2,MEMORY_MB:512,DISK_GB:2'");
  return [o](const Config& c, Say& say) { return run_migrate(c, *o, say); };
}

CommandEntry host(CLI::App& command) {
  using Action = HostOptions::Action;
  auto o = std::make_shared<HostOptions>();
  command.require_subcommand(1);
  auto action = [&command, o](const char* name, const char* help, Action chosen) {
    CLI::App* sub = command.add_subcommand(name, help);
    sub->add_option("host", o->host, "host name or provider uuid")->required();
    sub->callback([o, chosen] { o->action = chosen; });
    return sub;
  };
  auto* disable = action("disable", "schedule nothing more to a host; kept across its agent's restarts", Action::disable);
  disable->add_option("--reason", o->reason, "why, shown by show --hosts");
  disable->footer("Example: toyvm host disable compute-3 --reason 'disk replacement'");
  auto* drain = action("drain", "disable a host and move its instances to others, live where they run", Action::drain);
  drain->add_option("--parallel", o->parallel, "instances moved at once (default 1)")->check(CLI::Range(1, 64));
  drain->add_option("--reason", o->reason, "why, shown by show --hosts");
  add_seconds(*drain, "--timeout", o->move_timeout, "seconds each move may take");
  drain->footer("Stopped instances, and running ones that cannot move live, move cold (powered off).\n"
                "Exit 0 once no instance is left on the host.\nExample: toyvm host drain compute-3 --parallel 2");
  action("enable", "let a disabled host take work again", Action::enable);
  return [o](const Config& c, Say& say) { return run_host(c, *o, say); };
}

CommandEntry project(CLI::App& command) {
  using Action = ProjectOptions::Action;
  auto o = std::make_shared<ProjectOptions>();
  command.require_subcommand(1);
  auto action = [&command, o](const char* name, const char* help, Action chosen) {
    CLI::App* sub = command.add_subcommand(name, help);
    sub->callback([o, chosen] { o->action = chosen; });
    return sub;
  };
  const char* limit_help = "a limit as NAME=N: instances or a resource class (VCPU, MEMORY_MB, DISK_GB...); N may be "
                           "unlimited, or default to follow the defaults (repeatable)";
  auto* create = action("create", "make a project", Action::create);
  create->add_option("name", o->name, "project name: 1 to 32 of a-z 0-9 - _")->required();
  create->add_option("--limit", o->limits, limit_help);
  create->footer("Example: toyvm project create team-a --limit instances=10 --limit VCPU=20");
  action("list", "every project, its instances and limits", Action::list);
  auto* show = action("show", "a project's use against its limits", Action::show);
  show->add_option("name", o->name, "project name")->required();
  show->add_flag("--json", o->json, "print JSON");
  auto* set = action("set", "change a project's limits, or the defaults", Action::set);
  set->add_option("name", o->name, "project name");
  set->add_flag("--defaults", o->defaults, "the limits of every project that sets none of its own");
  set->add_option("--limit", o->limits, limit_help)->required();
  set->footer("A limit below today's use is taken: the project's requests are refused until it is under it.\n"
              "Example: toyvm project set team-a --limit VCPU=40");
  auto* remove = action("delete", "delete a project that has no instances", Action::remove);
  remove->add_option("name", o->name, "project name")->required();
  auto* add = action("add-member", "let an etcd user reach a project (etcd's own roles enforce it)", Action::add_member);
  add->add_option("name", o->name, "project name")->required();
  add->add_option("user", o->user, "etcd user: its TLS client certificate's common name, or a password user")
      ->required();
  add->add_option("--role", o->role, "member (schedule, show, stop, start, destroy) or reader (show)")
      ->check(CLI::IsMember({"member", "reader"}));
  add->add_option("--password-file", o->password_file, "a file holding the user's password (else: certificate only)");
  add->footer("Example: toyvm project add-member team-a alice --role member");
  auto* drop = action("remove-member", "take a user's roles in a project away", Action::remove_member);
  drop->add_option("name", o->name, "project name")->required();
  drop->add_option("user", o->user, "etcd user")->required();
  return [o](const Config& c, Say& say) -> Outcome {
    if (o->action == Action::set && o->defaults == !o->name.empty())
      return Error(errc::invalid_argument, "project set: give a project name or --defaults");
    return run_project(c, *o, say);
  };
}

CommandEntry evacuate(CLI::App& command) {
  auto host = std::make_shared<std::string>();
  command.add_option("host", *host, "host name or provider uuid")->required();
  command.footer("Only for a host whose agent is down, and which will not run its guests meanwhile (powered off\n"
                 "or cut off): each instance is rebuilt elsewhere from its image with a fresh disk.\n"
                 "Example: toyvm evacuate compute-3");
  return [host](const Config& c, Say& say) { return run_evacuate(c, *host, say); };
}

CommandEntry mdserver(CLI::App& command) {
  auto o = std::make_shared<MdserverOptions>();
  command.add_option("--listen", o->listen, "ADDRESS:PORT to serve on (repeatable; default 169.254.169.254:80)");
  command.footer("Example: toyvm mdserver --listen 169.254.169.254:80");
  return [o](const Config& c, Say&) { return run_mdserver(c, *o); };
}

CommandEntry scheduler(CLI::App& command) {
  auto o = std::make_shared<SchedulerServiceOptions>();
  command.add_option("--name", o->name, "this service's name as the leader's key says it (default: host:pid)");
  command.footer("Takes the requests projects' members put in their keys (toyvm schedule, stop, start, destroy\n"
                 "run with a member's etcd credentials), checks quotas, claims in Placement and hands over.\n"
                 "Several may run: one leads, the others take over when it goes.\n"
                 "Example: toyvm scheduler");
  return [o](const Config& c, Say&) { return run_scheduler_service(c, *o); };
}

constexpr Command table[] = {
    {"compute", "run the host agent", compute},
    {"schedule", "claim resources and start an instance on a host", schedule},
    {"show", "show an instance, every instance, or the hosts", show},
    {"destroy", "destroy instances and release their resources", destroy},
    {"stop", "power an instance off (it keeps its disk)", stop},
    {"start", "power a stopped instance on", start},
    {"audit", "check that Placement, etcd and the hosts' domains agree", audit},
    {"migrate", "move an instance to another host, live while it runs", migrate},
    {"resize", "give an instance a new size, moving it powered off where it fits", resize},
    {"host", "take a compute host out of service or bring it back", host},
    {"project", "make projects, and set what each may use", project},
    {"evacuate", "rebuild a dead host's instances on other hosts", evacuate},
    {"mdserver", "serve cloud-init metadata to guests", mdserver},
    {"scheduler", "claim and hand over for projects' members (a service)", scheduler},
};

}  // namespace

std::span<const Command> commands() { return table; }

}  // namespace toyvm
