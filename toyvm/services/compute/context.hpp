#pragma once
// What the parts of the compute agent share, none of it changed once the agent is built: the
// event loop, the config, the servers' clients, libvirt on the worker pool, this host's
// identity, and the stop. The agent owns all of it and outlives every part.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "core/async.hpp"
#include "core/backoff.hpp"
#include "core/config.hpp"
#include "core/stop.hpp"
#include "model/keys.hpp"
#include "virt/backend.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace toyvm::compute {

// Backend calls on the worker pool, since libvirt blocks. A guest sent to another host blocks
// its thread for as long as the move takes: those calls run on a pool of their own (`moves`,
// as many threads as the host sends guests at once), so the other guests never wait behind them.
class VirtCalls {
 public:
  VirtCalls(asio::thread_pool& pool, std::unique_ptr<VirtBackend> backend, asio::thread_pool* moves = nullptr)
      : pool_(pool), moves_(moves ? *moves : pool), backend_(std::move(backend)) {}

  // The lambda is a named local because GCC 12 mishandles capturing lambdas inside co_await
  // expressions.
  template <class R, class... Params, class... Args>
  awaitable<R> operator()(R (VirtBackend::*method)(Params...), Args... args) {
    auto call = [backend = backend_.get(), method, args...] { return (backend->*method)(args...); };
    co_return co_await run_blocking(pool_, std::move(call));
  }
  template <class R, class... Params, class... Args>
  awaitable<R> sending(R (VirtBackend::*method)(Params...), Args... args) {
    auto call = [backend = backend_.get(), method, args...] { return (backend->*method)(args...); };
    co_return co_await run_blocking(moves_, std::move(call));
  }

 private:
  asio::thread_pool& pool_;
  asio::thread_pool& moves_;
  std::unique_ptr<VirtBackend> backend_;
};

struct HostIdentity {
  std::string provider;      // resource provider uuid, kept in the state dir
  std::string name;
  std::string instance_dir;  // absolute
  bool new_provider = false;  // its uuid was made at this start: no Placement has it yet
};

struct AgentContext {
  asio::io_context& io;
  const Config& config;
  KeyLayout keys;
  std::shared_ptr<EtcdClient> etcd;
  Placement& placement;
  asio::thread_pool& pool;
  VirtCalls& virt;
  HostIdentity host;
  StopSignal& stop;  // SIGTERM: loops end, waits end, nothing new starts
  std::vector<std::string> guest_dns;  // what the guests' network offers, read as the host was set up
  std::function<void()> address_wanted;  // an instance at rest looks for its guest's address

  bool has_nic() const { return !config.compute.network.empty() || !config.compute.bridge.empty(); }

  // What this host tells the guest of `spec` (at `ip`, empty while unknown), through the
  // metadata service or a config drive.
  GuestView describe_guest(const WorkSpec& spec, const std::string& ip) const {
    const std::string& zone = config.compute.availability_zone;
    GuestView view = guest_view(spec, ip, zone.empty() ? config.mdserver.availability_zone : zone);
    if (has_nic()) {
      view.mac = instance_mac(spec.uuid);
      view.dns_servers = guest_dns;
    }
    return view;
  }
};

// Runs `task` detached. An exception ends it with a line in the log, not in silence.
inline void spawn_detached(asio::io_context& io, awaitable<void> task, std::string what) {
  asio::co_spawn(io, std::move(task), [what = std::move(what)](std::exception_ptr failure) {
    if (!failure) return;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      spdlog::critical("{} ended: {}", what, e.what());
    }
  });
}

}  // namespace toyvm::compute
