// toyvm-testbed: the tests' private servers (test::Servers) for the benchmarks and the fault
// campaigns, so that one testbed starts etcd (one member or a cluster) and Placement (sqlite
// or PostgreSQL) for all of them. It keeps them in the directory it is given, says their
// endpoints in one JSON line once they answer, then takes one command a line on stdin and
// answers each with one JSON line:
//   restart-etcd       every member killed (-9) and started again on its data
//   restart-placement  uWSGI killed (-9) and started again on the same database
//   compact-etcd       etcd's history compacted up to now: {"revision": N}
//   client-cert NAME   a client certificate for etcd user NAME: <pki>/NAME.crt and .key
// The end of its input stops them. With --etcd-tls and --etcd-auth, its first line also names
// the configuration file of etcd's root ("config") and the CA's directory ("pki").
//   usage: toyvm-testbed --dir DIR [--etcd-members N] [--postgresql] [--placement-workers N]
//                        [--etcd-tls] [--etcd-auth] [--etcd-arg FLAG]...
// (--etcd-arg: a flag for every etcd member, e.g. --etcd-arg=--auto-compaction-retention=5m)

#include "harness.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>

using namespace toyvm;
using namespace toyvm::test;

namespace {

void say(const std::string& json) {
  std::cout << json << std::endl;  // flushed: the caller waits for each line
}

}  // namespace

int main(int argc, char** argv) {
  ServersOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const bool valued = i + 1 < argc;
    if (arg == "--dir" && valued) options.dir = argv[++i];
    else if (arg == "--etcd-members" && valued) options.etcd_members = std::stoi(argv[++i]);
    else if (arg == "--placement-workers" && valued) options.placement_workers = std::stoi(argv[++i]);
    else if (arg == "--postgresql") options.postgresql = true;
    else if (arg == "--etcd-tls") options.etcd_tls = true;
    else if (arg == "--etcd-auth") options.etcd_auth = true;
    else if (arg.starts_with("--etcd-arg=")) options.etcd_args.emplace_back(arg.substr(11));
    else {
      std::fprintf(stderr, "toyvm-testbed: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (options.dir.empty()) {
    std::fprintf(stderr, "toyvm-testbed: --dir is required\n");
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);
  // Its answers alone on stdout: what its etcd client logs (a token renewed) goes to stderr.
  spdlog::set_default_logger(spdlog::stderr_logger_st("testbed"));
  try {
    Servers servers(options);
    say(fmt::format(R"({{"etcd": ["{}"], "placement": "{}", "config": "{}", "pki": "{}"}})",
                    fmt::join(servers.config.etcd.endpoints, "\", \""), servers.config.placement.endpoint,
                    servers.secure_config, servers.pki()));
    for (std::string command; std::getline(std::cin, command);) {
      if (command == "restart-etcd") {
        servers.stop_etcd(SIGKILL);
        servers.start_etcd_again();
        say(R"({"ok": true})");
      } else if (command == "restart-placement") {
        servers.stop_placement();
        servers.start_placement_again();
        say(R"({"ok": true})");
      } else if (command.starts_with("client-cert ")) {
        make_client_certificate(servers.pki(), command.substr(12));
        say(R"({"ok": true})");
      } else if (command == "compact-etcd") {
        say(fmt::format(R"({{"ok": true, "revision": {}}})", servers.etcd_compact()));
      } else {
        say(fmt::format(R"({{"ok": false, "error": "unknown command {}"}})", command));
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "toyvm-testbed: %s\n", e.what());
    return 1;
  }
  return 0;
}
