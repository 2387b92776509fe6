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
awaitable<Outcome> abort(const MigrateOptions& options, MoveRequests& moves, EtcdClient& etcd, Say& say) {
  auto asked = co_await moves.abort(options.uuid);
  if (!asked) co_return with_endpoints(etcd, asked.error());
  if (!options.wait) {
    say.line(fmt::format("ABORTING MOVE OF INSTANCE {}", options.uuid));
    co_return ExitCode::ok;
  }
  auto ended = co_await moves.follow(*asked, options.wait_timeout);
  if (!ended) co_return with_endpoints(etcd, ended.error());
  if (ended->host != asked->move.source)
    co_return Error(errc::changed,
                    fmt::format("instance {} moved to host {} before the abort took", options.uuid, ended->host));
  say.line(fmt::format("ABORTED MOVE OF INSTANCE {}: it stays on {} ({})", options.uuid, ended->host, ended->error));
  co_return ExitCode::ok;
}

}  // namespace

Outcome run_migrate(const Config& config, const MigrateOptions& options, Say& say) {
  if (!is_uuid(options.uuid))
    return Error(errc::invalid_argument, fmt::format("'{}' is not an instance uuid", options.uuid));
  return run_on_loop([&](asio::io_context& io) -> awaitable<Outcome> {
    auto etcd = EtcdClient::create(config.etcd);
    PlacementClient placement(io.get_executor(), config.placement);
    Placer placer(placement, *etcd, config);
    KeyLayout keys(config.etcd.prefix);
    std::string destination;
    if (!options.host.empty()) {
      auto provider = co_await resolve_host(placement, options.host);
      if (!provider) co_return provider.error();
      destination = *provider;
    }
    MoveRequests moves(*etcd, placer, keys);
    if (options.abort) co_return co_await abort(options, moves, *etcd, say);
    auto asked = co_await moves.ask(options.uuid, destination, options.cold, options.resize_to);
    if (!asked) {
      if (asked.error() == errc::no_allocations_left) {
        say.line("NO ALLOCATIONS LEFT");
        co_return ExitCode::no_allocations;
      }
      co_return with_endpoints(*etcd, asked.error());
    }
    const bool resize = !options.resize_to.empty();
    // A plain migrate of a stopped (or stopping) instance moves it powered off: said so.
    const char* how = !resize && asked->move.kind != MoveKind::live ? " (cold)" : "";
    if (!options.wait) {
      say.line(fmt::format("{} INSTANCE {} {} {}{}", resize ? "RESIZING" : "MIGRATING", options.uuid,
                           resize ? "ON" : "TO", asked->move.destination, how));
      co_return ExitCode::ok;
    }
    auto ended = co_await moves.follow(*asked, options.wait_timeout);
    if (!ended) co_return with_endpoints(*etcd, ended.error());
    if (!ended->moved)
      co_return Error(errc::changed,
                      fmt::format("instance {} stays on host {}: {}", options.uuid, asked->move.source, ended->error));
    say.line(fmt::format("{} INSTANCE {} {} {}{}", resize ? "RESIZED" : "MIGRATED", options.uuid,
                         resize ? "ON" : "TO", ended->host, how));
    co_return ExitCode::ok;
  });
}

}  // namespace toyvm
