// toyvm: one binary, one subcommand per service, listed in commands.cpp with the options each
// owns. The options all share are parsed here, merged into the configuration (flags >
// environment > file > defaults), and handed to the command's entry; what it ends with is
// told here (Terminal::finish), the one place that turns an outcome into an exit code.

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "commands.hpp"

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using namespace toyvm;

constexpr const char* kFooter = R"(Environment: TOYVM_CONFIG, TOYVM_ETCD, TOYVM_PLACEMENT, TOYVM_ETCD_PASSWORD (flags win).
Exit codes: 0 ok, 1 no allocations left, 2 bad usage or input, 3 unknown instance,
4 etcd or Placement unavailable, 5 any other failure.)";

// Whether the command line names this subcommand. Only the subcommand a command names gets its
// options built: CLI11 spends ~15,000 instructions on each, and a short command would otherwise
// build all fifty for the few it can take, a quarter of what `toyvm --version` executes.
bool named(int argc, char** argv, std::string_view subcommand) {
  for (int i = 1; i < argc; ++i)
    if (subcommand == argv[i]) return true;
  return false;
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

  // Several names may appear on a line (`schedule ... --name stop`): the entry run is the one
  // of the subcommand CLI11 parsed.
  std::vector<std::pair<CLI::App*, CommandEntry>> entries;
  for (const Command& command : commands()) {
    CLI::App* sub = app.add_subcommand(command.name, command.help);
    if (named(argc, argv, command.name)) entries.emplace_back(sub, command.add_options(*sub));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : static_cast<int>(ExitCode::usage);
  }

  init_logging(verbose);
  spdlog::debug("toyvm {} starting", TOYVM_VERSION);
  Terminal terminal;
  Outcome outcome = Error(errc::invalid_argument, "no command");
  if (auto config = load_config(common); !config) {
    outcome = Error(errc::invalid_config, config.error().message());
  } else {
    for (auto& [sub, entry] : entries)
      if (sub->parsed()) outcome = entry(*config, terminal);
  }
  const int code = terminal.finish(outcome);
  // gRPC's threads may still be finishing streams; ending here without running static
  // destructors avoids racing them and keeps short commands short.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}
