// toyvm: one binary, one subcommand per service. Flags are parsed here, merged into the
// configuration (flags > environment > file > defaults), and handed to the service's entry
// function, whose return value is the exit code.

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "services/services.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string_view>

namespace {

using namespace toyvm;

constexpr const char* kFooter = R"(Environment: TOYVM_CONFIG, TOYVM_ETCD, TOYVM_PLACEMENT, TOYVM_ETCD_PASSWORD (flags win).
Exit codes: 0 ok, 1 no allocations left, 2 bad usage or input, 3 unknown instance,
4 etcd or Placement unavailable, 5 any other failure.)";

// Whether the command line names this subcommand. Only the subcommand a command names gets its
// flags built: CLI11 spends ~15,000 instructions on each, and a short command would otherwise
// build all fifty for the few it can take, a quarter of what `toyvm --version` executes.
bool named(int argc, char** argv, std::string_view subcommand) {
  for (int i = 1; i < argc; ++i)
    if (subcommand == argv[i]) return true;
  return false;
}

// A duration flag, written in seconds (decimals allowed), held as a Duration.
CLI::Option* add_seconds(CLI::App* command, const std::string& name, Duration& target, const std::string& help) {
  auto set = [&target](double seconds) { target = from_seconds(seconds); };
  return command->add_option_function<double>(name, set, help)
      ->check(CLI::NonNegativeNumber)
      ->default_str(fmt::format("{:g}", in_seconds(target)));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"toyvm: schedule VMs with OpenStack Placement and etcd, run them with libvirt"};
  app.footer(kFooter);
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("toyvm ") + TOYVM_VERSION);

  CommonOverrides common;
  bool verbose = false;
  app.add_option("--config", common.config_file, "TOML configuration file (env TOYVM_CONFIG)");
  app.add_option("--etcd", common.etcd, "etcd endpoints, URL[,URL...] (env TOYVM_ETCD)");
  app.add_option("--placement", common.placement, "Placement endpoint URL (env TOYVM_PLACEMENT)");
  app.add_option("--etcd-ca", common.etcd_ca, "CA file for https:// etcd endpoints");
  app.add_option("--etcd-cert", common.etcd_cert, "client certificate for etcd (with --etcd-key)");
  app.add_option("--etcd-key", common.etcd_key, "client key for etcd");
  app.add_option("--etcd-server-name", common.etcd_server_name, "name to check etcd's certificate against");
  app.add_option("--etcd-user", common.etcd_user, "etcd user (password in env TOYVM_ETCD_PASSWORD)");
  app.add_flag("-v,--verbose", verbose, "debug logs on stderr");

  // Subcommand flags that override the configuration file.
  std::string state_dir, libvirt_uri, inventory, name;
  std::vector<std::string> traits;
  ScheduleOptions schedule;
  ShowOptions show;
  DestroyOptions destroy;
  bool destroy_no_wait = false;
  std::function<int(const Config&)> service;

  auto* compute = app.add_subcommand("compute", "run the host agent");
  std::string zone;
  int max_instances = -1;
  if (named(argc, argv, "compute")) {
    compute->add_option("--state-dir", state_dir, "where the provider uuid and instances live");
    compute->add_option("--libvirt-uri", libvirt_uri, "libvirt connection URI, e.g. qemu:///system");
    compute->add_option("--inventory", inventory,
                        "inventory instead of measuring, e.g. VCPU:4,DISK_GB:10,MEMORY_MB:512");
    compute->add_option("--name", name, "provider name (default: the host name)");
    compute->add_option("--trait", traits, "a trait to report, e.g. CUSTOM_GPU (repeatable)");
    compute->add_option("--az", zone, "availability zone (a Placement aggregate)");
    compute->add_option("--max-instances", max_instances, "report FULL at this many instances (0: no limit)");
    compute->footer("Example: toyvm compute --state-dir /var/lib/toyvm --libvirt-uri qemu:///system");
    compute->callback([&] {
      service = [&](const Config& base) {
        Config config = base;
        ComputeConfig& c = config.compute;
        if (!state_dir.empty()) c.state_dir = state_dir;
        if (!libvirt_uri.empty()) c.libvirt_uri = libvirt_uri;
        if (!inventory.empty()) c.inventory = inventory;
        if (!name.empty()) c.name = name;
        if (!traits.empty()) c.traits = traits;
        if (!zone.empty()) c.availability_zone = zone;
        if (max_instances >= 0) c.max_instances = max_instances;
        return run_compute(config);
      };
    });
  }

  auto* sched = app.add_subcommand("schedule", "claim resources and start an instance on a host");
  if (named(argc, argv, "schedule")) {
    sched->add_option("query", schedule.query, "Placement query, e.g. 'resources=VCPU:1,MEMORY_MB:256'")->required();
    sched->add_option("--image", schedule.image, "image: a name in the agents' image dir, or an http(s) or file URL");
    sched->add_option("--image-sha256", schedule.image_sha256, "the image's expected SHA-256 (hex)");
    sched->add_option("--image-format", schedule.image_format, "raw or qcow2, for an image whose name does not say")
        ->check(CLI::IsMember({"raw", "qcow2"}));
    sched->add_option("--az", schedule.availability_zone, "only hosts in this availability zone");
    sched->add_option("--group", schedule.group, "server group to join");
    sched->add_option("--group-policy", schedule.group_policy,
                      "affinity, anti-affinity (default) or soft-anti-affinity")
        ->check(CLI::IsMember({"affinity", "anti-affinity", "soft-anti-affinity"}));
    sched->add_option("--count", schedule.count, "place this many instances, all or nothing")
        ->check(CLI::Range(1, 10000));
    sched->add_option("--policy", schedule.policy, "host weighing: spread (default) or pack")
        ->check(CLI::IsMember({"spread", "pack"}));
    sched->add_option("--name", schedule.name, "instance name (also its hostname)");
    sched->add_option("--user-data", schedule.user_data_file, "file given to cloud-init as user data");
    sched->add_option("--key", schedule.keys, "ssh public key as NAME=PUBKEY (repeatable)");
    sched->add_option("--key-file", schedule.key_files, "ssh public key file (repeatable)");
    sched->add_flag("--config-drive", schedule.config_drive,
                    "give the guest its metadata on a config drive too (for networks without 169.254.169.254)");
    sched->add_flag("--wait", schedule.wait,
                    "wait for ACTIVE (and the guest IP, with a NIC) or ERROR, printing each state");
    add_seconds(sched, "--timeout", schedule.wait_timeout, "seconds to --wait");
    sched->footer("Example: toyvm schedule 'resources=VCPU:1,DISK_GB:1,MEMORY_MB:256' --wait");
    sched->callback([&] { service = [&](const Config& c) { return run_schedule(c, schedule); }; });
  }

  auto* show_cmd = app.add_subcommand("show", "show an instance, every instance, or the hosts");
  if (named(argc, argv, "show")) {
    show_cmd->add_option("uuid", show.uuid, "instance uuid (omit to list every instance)");
    show_cmd->add_flag("--json", show.json, "print JSON");
    show_cmd->add_flag("--hosts", show.hosts, "list the compute hosts");
    auto* console_flag = show_cmd->add_flag("--console", show.console,
                                            "print the tail of the instance's serial console, control characters "
                                            "shown as ^X");
    show_cmd->add_flag("--raw", show.raw, "with --console: the guest's bytes as they are, escape sequences too")
        ->needs(console_flag);
    show_cmd->add_flag("--follow", show.follow,
                       "with --console: keep printing what the guest writes, until interrupted")
        ->needs(console_flag);
    show_cmd->add_flag("--watch", show.watch,
                       "print each change of an instance's state (or every instance's) as it happens, a line each "
                       "(--json: an object each), until interrupted")
        ->excludes(console_flag);
    add_seconds(show_cmd, "--timeout", show.timeout,
                "seconds the instance's host has to answer (its usage, its console)");
    show_cmd->footer("Example: toyvm show d578fb7c-7787-4e73-b69a-a7b3ef9bf73a --json");
    show_cmd->callback([&] { service = [&](const Config& c) { return run_show(c, show); }; });
  }

  auto* destroy_cmd = app.add_subcommand("destroy", "destroy an instance and release its resources");
  if (named(argc, argv, "destroy")) {
    destroy_cmd->add_option("uuid", destroy.uuid, "instance uuid")->required();
    destroy_cmd->add_flag("--no-wait", destroy_no_wait, "return once the request is recorded");
    destroy_cmd->add_flag("--force", destroy.force,
                          "the host is gone for good: release the allocation and remove the keys here");
    add_seconds(destroy_cmd, "--timeout", destroy.wait_timeout, "seconds to wait for the host");
    destroy_cmd->footer("Example: toyvm destroy d578fb7c-7787-4e73-b69a-a7b3ef9bf73a");
    destroy_cmd->callback([&] {
      destroy.wait = !destroy_no_wait;
      service = [&](const Config& c) { return run_destroy(c, destroy); };
    });
  }

  PowerOptions power;
  bool power_no_wait = false;
  for (bool on : {false, true}) {
    auto* cmd = app.add_subcommand(on ? "start" : "stop",
                                   on ? "power a stopped instance on" : "power an instance off (it keeps its disk)");
    if (!named(argc, argv, on ? "start" : "stop")) continue;
    cmd->add_option("uuid", power.uuid, "instance uuid")->required();
    cmd->add_flag("--no-wait", power_no_wait, "return once the request is recorded");
    add_seconds(cmd, "--timeout", power.wait_timeout, "seconds to wait for the host");
    cmd->callback([&, on] {
      power.power = on ? PowerState::running : PowerState::stopped;
      power.wait = !power_no_wait;
      service = [&](const Config& c) { return run_power(c, power); };
    });
  }

  AuditOptions audit;
  auto* audit_cmd = app.add_subcommand("audit", "check that Placement, etcd and the hosts' domains agree");
  if (named(argc, argv, "audit")) {
    audit_cmd->add_flag("--json", audit.json, "print JSON");
    audit_cmd->add_flag("--fix", audit.fix,
                        "release allocations nobody owns or an ERROR instance holds, drop members of gone "
                        "instances; each only when seen again after --grace seconds");
    add_seconds(audit_cmd, "--grace", audit.grace, "seconds between the two looks of --fix");
    add_seconds(audit_cmd, "--move-deadline", audit.move_deadline,
                "seconds a move may be in flight before it is a finding (move_overdue)");
    audit_cmd->footer("Exit 0 when everything agrees, 1 when something does not (after --fix: is still not).\n"
                      "Example: toyvm audit --fix");
    audit_cmd->callback([&] { service = [&](const Config& c) { return run_audit(c, audit); }; });
  }

  MigrateOptions migrate;
  bool migrate_no_wait = false;
  auto* migrate_cmd = app.add_subcommand("migrate", "move an instance to another host, live while it runs");
  if (named(argc, argv, "migrate")) {
    migrate_cmd->add_option("uuid", migrate.uuid, "instance uuid")->required();
    migrate_cmd->add_option("--host", migrate.host,
                            "destination host name or provider uuid (default: the best other host for its query)");
    migrate_cmd->add_flag("--no-wait", migrate_no_wait, "return once the move is asked for");
    migrate_cmd->add_flag("--cold", migrate.cold, "power it off, copy its disk, start it there (a stopped one stays off)");
    migrate_cmd->add_flag("--abort", migrate.abort,
                          "undo its move in flight (a live send running is aborted); it stays where it was");
    add_seconds(migrate_cmd, "--timeout", migrate.wait_timeout, "seconds to wait for the move");
    migrate_cmd->footer("Its disk and memory are copied while it runs; it keeps its uuid, MAC and address.\n"
                        "A stopped instance moves cold, and stays stopped.\n"
                        "Example: toyvm migrate d578fb7c-7787-4e73-b69a-a7b3ef9bf73a --host compute-2");
    migrate_cmd->callback([&] {
      migrate.wait = !migrate_no_wait;
      service = [&](const Config& c) { return run_migrate(c, migrate); };
    });
  }

  HostOptions host;
  auto* resize_cmd = app.add_subcommand("resize", "give an instance a new size, moving it powered off where it fits");
  if (named(argc, argv, "resize")) {
    resize_cmd->add_option("uuid", migrate.uuid, "instance uuid")->required();
    resize_cmd->add_option("query", migrate.resize_to, "its new placement query, e.g. 'resources=VCPU:2,MEMORY_MB:512,DISK_GB:2'")
        ->required();
    resize_cmd->add_option("--host", migrate.host, "destination host name or provider uuid (its own allowed)");
    resize_cmd->add_flag("--no-wait", migrate_no_wait, "return once the resize is asked for");
    add_seconds(resize_cmd, "--timeout", migrate.wait_timeout, "seconds to wait for the resize");
    resize_cmd->footer("Its disk grows with DISK_GB and never shrinks; it keeps its uuid, MAC, address and disk\n"
                       "contents, and its power state.\n"
                       "Example: toyvm resize d578fb7c-7787-4e73-b69a-a7b3ef9bf73a 'resources=VCPU:2,MEMORY_MB:512,DISK_GB:2'");
    resize_cmd->callback([&] {
      migrate.wait = !migrate_no_wait;
      service = [&](const Config& c) { return run_migrate(c, migrate); };
    });
  }

  auto* host_cmd = app.add_subcommand("host", "take a compute host out of service or bring it back");
  host_cmd->require_subcommand(1);
  if (named(argc, argv, "host")) {
    auto* disable_cmd =
        host_cmd->add_subcommand("disable", "schedule nothing more to a host; kept across its agent's restarts");
    disable_cmd->add_option("host", host.host, "host name or provider uuid")->required();
    disable_cmd->add_option("--reason", host.reason, "why, shown by show --hosts");
    disable_cmd->footer("Example: toyvm host disable compute-3 --reason 'disk replacement'");
    disable_cmd->callback([&] {
      host.action = HostOptions::Action::disable;
      service = [&](const Config& c) { return run_host(c, host); };
    });
    auto* drain_cmd =
        host_cmd->add_subcommand("drain", "disable a host and move its instances to others, live where they run");
    drain_cmd->add_option("host", host.host, "host name or provider uuid")->required();
    drain_cmd->add_option("--parallel", host.parallel, "instances moved at once (default 1)")
        ->check(CLI::Range(1, 64));
    drain_cmd->add_option("--reason", host.reason, "why, shown by show --hosts");
    add_seconds(drain_cmd, "--timeout", host.move_timeout, "seconds each move may take");
    drain_cmd->footer("Stopped instances, and running ones that cannot move live, move cold (powered off).\n"
                      "Exit 0 once no instance is left on the host.\nExample: toyvm host drain compute-3 --parallel 2");
    drain_cmd->callback([&] {
      host.action = HostOptions::Action::drain;
      service = [&](const Config& c) { return run_host(c, host); };
    });
    auto* enable_cmd = host_cmd->add_subcommand("enable", "let a disabled host take work again");
    enable_cmd->add_option("host", host.host, "host name or provider uuid")->required();
    enable_cmd->callback([&] {
      host.action = HostOptions::Action::enable;
      service = [&](const Config& c) { return run_host(c, host); };
    });
  }
  auto* evacuate_cmd = app.add_subcommand("evacuate", "rebuild a dead host's instances on other hosts");
  if (named(argc, argv, "evacuate")) {
    evacuate_cmd->add_option("host", host.host, "host name or provider uuid")->required();
    evacuate_cmd->footer(
        "Only for a host whose agent is down, and which will not run its guests meanwhile (powered off\n"
        "or cut off): each instance is rebuilt elsewhere from its image with a fresh disk.\n"
        "Example: toyvm evacuate compute-3");
    evacuate_cmd->callback([&] {
      host.action = HostOptions::Action::evacuate;
      service = [&](const Config& c) { return run_host(c, host); };
    });
  }

  MdserverOptions mdserver;
  auto* md = app.add_subcommand("mdserver", "serve cloud-init metadata to guests");
  if (named(argc, argv, "mdserver")) {
    md->add_option("--listen", mdserver.listen, "ADDRESS:PORT to serve on (repeatable; default 169.254.169.254:80)");
    md->footer("Example: toyvm mdserver --listen 169.254.169.254:80");
    md->callback([&] { service = [&](const Config& c) { return run_mdserver(c, mdserver); }; });
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : static_cast<int>(ExitCode::usage);
  }

  init_logging(verbose);
  spdlog::debug("toyvm {} starting", TOYVM_VERSION);
  auto config = load_config(common);
  if (!config) {
    std::fprintf(stderr, "toyvm: %s\n", config.error().message().c_str());
    return static_cast<int>(ExitCode::usage);
  }
  int code = service(*config);
  // gRPC's threads may still be finishing streams; ending here without running static
  // destructors avoids racing them and keeps short commands short.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}
