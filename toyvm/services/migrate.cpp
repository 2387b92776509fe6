// toyvm migrate: an instance moves to another host, while it runs (its memory and disk copied
// live by libvirt, peer to peer) or, with --cold or when it is stopped, powered off (its disk
// copied through libvirt's storage volume streams, its power state kept). toyvm resize is a
// cold move to a new size, its own host allowed when it has room for both sizes. The command
// claims the destination and records the move; the two hosts' agents carry it out and either
// finish it or undo it, whatever becomes of the command.

#include "model/uuid.hpp"
#include "services/common.hpp"
#include "services/move_request.hpp"
#include "services/services.hpp"

namespace toyvm {

namespace {

// --abort: the move asked undone, and followed to its end.
awaitable<int> abort(const MigrateOptions& options, MoveRequests& moves, EtcdClient& etcd) {
  auto asked = co_await moves.abort(options.uuid);
  if (!asked) {
    if (is_etcd_error(asked.error())) co_return etcd_failure(etcd, asked.error());
    co_return report_failure(asked.error());
  }
  if (!options.wait) {
    std::printf("ABORTING MOVE OF INSTANCE %s\n", options.uuid.c_str());
    co_return 0;
  }
  auto ended = co_await moves.follow(*asked, options.wait_timeout);
  if (!ended) {
    if (is_etcd_error(ended.error())) co_return etcd_failure(etcd, ended.error());
    co_return report_failure(ended.error());
  }
  if (ended->host != asked->move.source)
    co_return report_failure(ExitCode::failed, fmt::format("instance {} moved to host {} before the abort took",
                                                           options.uuid, ended->host));
  std::printf("ABORTED MOVE OF INSTANCE %s: it stays on %s (%s)\n", options.uuid.c_str(), ended->host.c_str(),
              ended->error.c_str());
  co_return 0;
}

}  // namespace

int run_migrate(const Config& config, const MigrateOptions& options) {
  if (!is_uuid(options.uuid))
    return report_failure(errc::invalid_argument, fmt::format("'{}' is not an instance uuid", options.uuid));
  return run_on_loop([&](asio::io_context& io) -> awaitable<int> {
    auto etcd = EtcdClient::create(config.etcd);
    PlacementClient placement(io.get_executor(), config.placement);
    Placer placer(placement, *etcd, config);
    KeyLayout keys(config.etcd.prefix);
    std::string destination;
    if (!options.host.empty()) {
      auto provider = co_await resolve_host(placement, options.host);
      if (!provider) co_return report_failure(provider.error());
      destination = *provider;
    }
    MoveRequests moves(*etcd, placer, keys);
    if (options.abort) co_return co_await abort(options, moves, *etcd);
    auto asked = co_await moves.ask(options.uuid, destination, options.cold, options.resize_to);
    if (!asked) {
      if (asked.error() == errc::no_allocations_left) {
        std::printf("NO ALLOCATIONS LEFT\n");
        co_return int(ExitCode::no_allocations);
      }
      if (is_etcd_error(asked.error())) co_return etcd_failure(*etcd, asked.error());
      co_return report_failure(asked.error());
    }
    const bool resize = !options.resize_to.empty();
    // A plain migrate of a stopped (or stopping) instance moves it powered off: said so.
    const char* how = !resize && asked->move.kind != MoveKind::live ? " (cold)" : "";
    if (!options.wait) {
      std::printf("%s INSTANCE %s %s %s%s\n", resize ? "RESIZING" : "MIGRATING", options.uuid.c_str(),
                  resize ? "ON" : "TO", asked->move.destination.c_str(), how);
      co_return 0;
    }
    auto ended = co_await moves.follow(*asked, options.wait_timeout);
    if (!ended) {
      if (is_etcd_error(ended.error())) co_return etcd_failure(*etcd, ended.error());
      co_return report_failure(ended.error());
    }
    if (!ended->moved)
      co_return report_failure(ExitCode::failed, fmt::format("instance {} stays on host {}: {}", options.uuid,
                                                             asked->move.source, ended->error));
    std::printf("%s INSTANCE %s %s %s%s\n", resize ? "RESIZED" : "MIGRATED", options.uuid.c_str(),
                resize ? "ON" : "TO", ended->host.c_str(), how);
    co_return 0;
  });
}

}  // namespace toyvm
