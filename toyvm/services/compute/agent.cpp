// toyvm compute: the host agent. It registers the host in Placement under a stable provider
// uuid, announces itself in etcd under a lease, and reconciles the instances etcd says should
// run here with the domains libvirt has: on start, on every watch event, and after every
// reconnect. Each part lives in its own file of this folder; the agent owns them and wires
// them together once (AgentParts, agent.hpp).

#include "services/compute/agent.hpp"

#include "core/log.hpp"
#include "core/metrics.hpp"
#include "core/idle_pages.hpp"
#include "services/common.hpp"
#include "services/compute/work_feed.hpp"
#include "services/metrics_http.hpp"
#include "services/services.hpp"
#include "virt/libvirt_backend.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iterator>

namespace toyvm {

namespace compute {

namespace fs = std::filesystem;

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

namespace {

// What set_up_host and a simulated host share: identity, dirs, inventory, images.
result<HostSetup> set_up_common(const ComputeConfig& c) {
  HostSetup setup;
  HostIdentity& host = setup.host;
  auto uuid = load_or_create_provider_uuid(c.state_dir, &host.new_provider);
  if (!uuid) return uuid.error();
  host.provider = *uuid;
  host.name = c.name.empty() ? host_name() : c.name;
  std::error_code ec;
  const fs::path state_dir = fs::absolute(c.state_dir, ec);
  host.instance_dir =
      c.instance_dir.empty() ? (state_dir / "instances").string() : fs::absolute(c.instance_dir, ec).string();
  fs::create_directories(host.instance_dir, ec);
  // QEMU runs as its own user on qemu:///system and must reach instance files and images.
  fs::permissions(host.instance_dir, fs::perms(0755), ec);
  if (!c.inventory.empty()) {
    auto amounts = parse_resource_amounts(c.inventory);
    if (!amounts) return amounts.error().doing("invalid --inventory");
    setup.inventory = inventory_from_amounts(*amounts);
  } else {
    auto facts = measure_host(host.instance_dir);
    if (!facts) return facts.error().doing("cannot measure this host's resources");
    setup.inventory = inventory_from_host(*facts, c.policy);
  }
  ImageStoreOptions& images = setup.images;
  images.image_dir = c.image_dir.empty() ? (state_dir / "images").string() : c.image_dir;
  images.cache_dir = c.image_cache_dir.empty() ? (state_dir / "image-cache").string() : c.image_cache_dir;
  images.cache_max_bytes = uint64_t(c.image_cache_max_gb * double(1 << 30));
  images.max_download_bytes = uint64_t(c.image_max_gb * double(1 << 30));
  images.schemes = c.image_schemes;
  images.ca_file = c.image_ca_file;
  return setup;
}

}  // namespace

result<HostSetup> set_up_host(const ComputeConfig& c) {
  auto common = set_up_common(c);
  if (!common) return common.error();
  HostSetup setup = std::move(*common);
  const HostIdentity& host = setup.host;
  std::ifstream cpuinfo("/proc/cpuinfo");
  setup.cpu_traits = cpu_traits(std::string(std::istreambuf_iterator<char>(cpuinfo), std::istreambuf_iterator<char>()));
  LibvirtOptions libvirt{c.libvirt_uri, c.domain_type, host.instance_dir, c.network, c.bridge, c.nic_model,
                         c.guest_filter, host.provider};
  auto backend = open_libvirt(libvirt);
  if (!backend) return backend.error();
  setup.backend = std::move(*backend);
  // The guests' network first: its bridge is where the metadata address usually goes.
  if (auto network = setup.backend->ensure_network(); !network)
    spdlog::error("libvirt network {}: {}", c.network, network.error().message());
  // Told to guests in their network data; without it they still have what DHCP says.
  if (auto dns = setup.backend->network_dns()) setup.guest_dns = std::move(*dns);
  return setup;
}

result<HostSetup> set_up_simulated_host(const ComputeConfig& c, std::shared_ptr<MemoryHosts> hosts) {
  if (c.inventory.empty()) return Error(errc::invalid_argument, "a simulated host needs --inventory");
  auto setup = set_up_common(c);
  if (!setup) return setup.error();
  auto backend = std::make_unique<MemoryVirt>(std::move(hosts), c.move_libvirt_uri);
  auto total = [&](const char* resource_class) {
    auto item = setup->inventory.find(resource_class);
    return item == setup->inventory.end() ? int64_t(0) : item->second.total;
  };
  backend->set_machine(total("MEMORY_MB"), total("DISK_GB"), total("VCPU"));
  setup->backend = std::move(backend);
  // Not this machine's: and 10,000 watches would take every inotify instance its user may have.
  setup->dhcp_leases = false;
  return setup;
}

AgentParts::AgentParts(AgentContext& ctx, Inventory inventory, std::vector<std::string> cpu_traits,
                       ImageStoreOptions image_options)
    : placer(ctx.placement, *ctx.etcd, ctx.config),
      recorder(ctx),
      registration(ctx, std::move(inventory), std::move(cpu_traits)),
      images(ctx.io.get_executor(), ctx.pool, std::move(image_options)),
      presence(ctx, [this] { return instances.holding_work(); }),
      maintenance(ctx, registration, presence),
      builder(ctx, Builder::Parts{recorder, images, placer, [this] { return instances.images_wanted(); },
                                  [this] { return maintenance.disabled(); }}),
      mover(ctx, builder, placer),
      instances(ctx, recorder, builder, presence, mover),
      observer(ctx, instances),
      metadata(ctx, instances) {
  presence.set_capacity(capacity_of(registration.inventory()));
}

}  // namespace compute

namespace {

using namespace std::chrono_literals;
using namespace compute;

// The servers' clients and the stop, which the agent's start-up needs before the host's own
// parts can be built (a host that lost its state dir adopts its provider by name first).
struct Servers {
  Servers(asio::io_context& io, const Config& config)
      : placement(io.get_executor(), config.placement), etcd(EtcdClient::create(config.etcd)) {}
  PlacementClient placement;
  std::shared_ptr<EtcdClient> etcd;
  StopSignal stop;
};

// The threads the agents' blocking calls run on: one host's own, or shared by the simulated
// hosts of one process. Joined before any agent goes: a call under way uses its agent's parts.
struct AgentThreads {
  AgentThreads(int workers, int sends) : pool(size_t(workers)), sends(size_t(sends)) {}
  ~AgentThreads() { join(); }
  void join() {
    pool.join();
    sends.join();
  }
  asio::thread_pool pool;
  asio::thread_pool sends;  // guests sent to other hosts
};

class ComputeAgent {
 public:
  ComputeAgent(asio::io_context& io, const Config& config, Servers& servers, HostSetup setup, AgentThreads& threads)
      : config_(config),
        virt_(threads.pool, with_lifecycle_events(io, std::move(setup.backend)), &threads.sends),
        ctx_{io, config_, KeyLayout(config_.etcd.prefix), servers.etcd, servers.placement, threads.pool, virt_,
             std::move(setup.host), servers.stop, std::move(setup.guest_dns),
             [this] { parts_.observer.wake(); }},
        parts_(ctx_, std::move(setup.inventory), std::move(setup.cpu_traits), std::move(setup.images)),
        work_(ctx_, ctx_.keys.work_prefix(ctx_.host.provider),
              KeyFeed::Handlers{[this](RangeResult listed) { return parts_.instances.apply_listing(std::move(listed)); },
                                [this](const WatchEvent& event) { parts_.instances.apply(event); }}),
        moves_(ctx_, ctx_.keys.moves_prefix(),
               KeyFeed::Handlers{
                   [this](RangeResult listed) { return parts_.instances.apply_move_listing(std::move(listed)); },
                   [this](const WatchEvent& event) { parts_.instances.apply_move(event); }}),
        dhcp_leases_(setup.dhcp_leases) {
    spdlog::info("provider {} ({}), libvirt {}", ctx_.host.provider, ctx_.host.name, config_.compute.libvirt_uri);
  }

  // Its metrics and metadata served, registered, announced, its moves known, its loops started.
  awaitable<result<void>> start_up() {
    if (auto served = serve_agent_metrics(); !served) co_return served.error();
    spawn_detached(ctx_.io, parts_.metadata.run(), "serving metadata");
    co_await parts_.maintenance.load();
    co_await parts_.registration.register_until_done();
    if (!ctx_.stop.requested()) co_await parts_.presence.announce();
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, parts_.presence.keep_alive(), "keeping the lease alive");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, parts_.presence.report_stats(), "reporting the host's figures");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, parts_.maintenance.follow(), "following the operator's disable");
    // Moves first: a guest arriving here is no stranger to the first listing of the work.
    if (!ctx_.stop.requested()) co_await moves_.load();
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, moves_.follow(), "following moves");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, moves_.resync_periodically(), "resyncing moves");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, work_.resync_periodically(), "resyncing");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, parts_.observer.run(), "observing guests");
    if (!ctx_.stop.requested() && dhcp_leases_)
      spawn_detached(ctx_.io, parts_.observer.watch_leases(), "watching leases");
    if (!ctx_.stop.requested())
      spawn_detached(ctx_.io, parts_.observer.follow_console_requests(), "following console requests");
    if (!ctx_.stop.requested())
      spawn_detached(ctx_.io, parts_.observer.follow_usage_requests(), "following usage requests");
    co_return result<void>{};
  }

  // This host's work followed until a signal, then its presence ended.
  awaitable<void> serve() {
    if (!ctx_.stop.requested()) co_await work_.follow();  // until a signal
    // The host record goes with the lease; the provider is marked disabled so that
    // schedulers spend no candidate on it; the next start sets the traits afresh (disabled
    // again if an operator disabled the host).
    co_await parts_.presence.revoke();
    co_await parts_.registration.mark_disabled();
  }

  void stop() {
    work_.stop();
    moves_.stop();
  }

 private:
  // A guest that stops, crashes or is killed outside toyvm is looked at at once; the periodic
  // resync remains the net for an event that is lost. (Events come on libvirt's thread; the
  // loop, which is building the agent now, runs them once it is built.)
  std::unique_ptr<VirtBackend> with_lifecycle_events(asio::io_context& io, std::unique_ptr<VirtBackend> backend) {
    backend->on_lifecycle([this, &io](const std::string& uuid, bool started) {
      asio::post(io, [this, uuid, started] { parts_.instances.observe(uuid, started); });
    });
    return backend;
  }

  // Prometheus' /metrics, when asked for, with the instances by the state recorded here.
  result<void> serve_agent_metrics() {
    const std::string& address = config_.compute.metrics_listen;
    if (address.empty()) return {};
    if (auto served = serve_metrics(ctx_.io, address, config_.mdserver.listen); !served) return served.error();
    metrics::on_render([this] {
      std::map<std::string, int> by_state;
      for (InstanceState state : {InstanceState::scheduled, InstanceState::building, InstanceState::active,
                                  InstanceState::stopped, InstanceState::error, InstanceState::deleting})
        by_state[std::string(to_string(state))] = 0;
      // Scrapes are answered on the event loop's thread, which the instances belong to.
      for (const auto& [uuid, instance] : parts_.instances.all())
        if (auto state = recorded_state(instance->phase())) by_state[std::string(to_string(*state))] += 1;
      for (auto& [state, n] : by_state) metrics::set("toyvm_instances", n, {{"state", state}});
    });
    return {};
  }

  const Config& config_;
  VirtCalls virt_;
  AgentContext ctx_;
  AgentParts parts_;
  KeyFeed work_;   // this host's work
  KeyFeed moves_;  // guests moving, here or away
  bool dhcp_leases_;
};

// Start-up, each burst of work (builds, deletions) and the periodic jobs (a resync a minute,
// the host's figures every 30 s) run code that then lies idle for a long while. Once the
// agent has been quiet for a few seconds, the pages of its executable and libraries are
// given back; what runs after (the lease's keep-alive, timers) comes back. What it does is
// read from what the metrics count: its requests to etcd and Placement, its listings.
awaitable<void> release_pages_when_quiet(StopSignal& stop) {
  auto activity = [] {
    return metrics::total("toyvm_etcd_requests_total") + metrics::total("toyvm_placement_requests_total") +
           metrics::total("toyvm_work_listings_total");
  };
  double seen = activity();
  std::optional<double> released_at;
  while (co_await stop.sleep(3s)) {
    if (const double now = activity(); now != seen) {
      seen = now;  // still busy
      continue;
    }
    if (released_at == seen) continue;  // nothing ran since the last time
    release_idle_pages();
    released_at = seen;
  }
}

// This host's provider (adopted by name when its state dir was lost), its parts, then the
// agent until a signal. `agent` is the caller's: detached steps refer to it until the loop ends.
awaitable<Outcome> start(asio::io_context& io, const Config& config, Servers& servers, AgentThreads& threads,
                         std::unique_ptr<ComputeAgent>& agent) {
  const ComputeConfig& c = config.compute;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const error_code& ec, int) {
    if (ec) return;
    spdlog::info("shutting down");
    servers.stop.request();
    if (agent) agent->stop();
  });
  // (Arguments made outside co_await: GCC 12 frees such temporaries twice.)
  KeyLayout keys(config.etcd.prefix);
  std::string name = c.name.empty() ? host_name() : c.name;
  co_await adopt_provider_by_name(servers.placement, *servers.etcd, std::move(keys), servers.stop, c.state_dir,
                                  std::move(name));
  if (servers.stop.requested()) co_return ExitCode::ok;
  auto setup = set_up_host(c);
  if (!setup) co_return setup.error();
  agent = std::make_unique<ComputeAgent>(io, config, servers, std::move(*setup), threads);
  if (auto started = co_await agent->start_up(); !started) co_return started.error();
  spawn_detached(io, release_pages_when_quiet(servers.stop), "releasing idle pages");
  co_await agent->serve();
  co_return ExitCode::ok;
}

// How many simulated hosts are starting and serving; `changed` wakes whoever waits on either.
struct SimulatedHosts {
  explicit SimulatedHosts(asio::io_context& io) : changed(io, asio::steady_timer::time_point::max()) {}
  asio::steady_timer changed;
  size_t starting = 0;
  size_t serving = 0;
};

// (Parameters, not a capturing lambda: a coroutine lambda's captures die with the lambda.)
awaitable<void> run_simulated(ComputeAgent& agent, SimulatedHosts& hosts) {
  auto started = co_await agent.start_up();
  --hosts.starting;
  hosts.changed.cancel();
  if (!started) spdlog::error("a simulated host did not start: {}", started.error().message());
  else co_await agent.serve();
  --hosts.serving;
  hosts.changed.cancel();
}

// Starts the simulated hosts a few at a time, as a cloud's hosts come up, and runs them until a
// signal. `agents` is the caller's, as for one host.
awaitable<Outcome> start_simulated(asio::io_context& io, const std::vector<Config>& configs, Servers& servers,
                                   AgentThreads& threads, std::shared_ptr<MemoryHosts> hypervisors,
                                   std::vector<std::unique_ptr<ComputeAgent>>& agents) {
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const error_code& ec, int) {
    if (ec) return;
    spdlog::info("shutting down {} simulated hosts", agents.size());
    servers.stop.request();
    for (auto& agent : agents)
      if (agent) agent->stop();
  });
  SimulatedHosts hosts(io);
  const size_t at_once = 32;  // start-ups under way at once
  const auto began = std::chrono::steady_clock::now();
  for (const Config& config : configs) {
    if (servers.stop.requested()) break;
    auto setup = set_up_simulated_host(config.compute, hypervisors);
    if (!setup) co_return setup.error().doing(config.compute.name);
    agents.push_back(std::make_unique<ComputeAgent>(io, config, servers, std::move(*setup), threads));
    while (hosts.starting >= at_once && !servers.stop.requested())
      co_await hosts.changed.async_wait(asio::as_tuple(use_awaitable));
    ++hosts.starting;
    ++hosts.serving;
    spawn_detached(io, run_simulated(*agents.back(), hosts), "a simulated host");
  }
  while (hosts.starting > 0) co_await hosts.changed.async_wait(asio::as_tuple(use_awaitable));
  spdlog::info("{} simulated hosts started in {:.1f} s", agents.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  spawn_detached(io, release_pages_when_quiet(servers.stop), "releasing idle pages");
  while (hosts.serving > 0) co_await hosts.changed.async_wait(asio::as_tuple(use_awaitable));
  co_return ExitCode::ok;
}

}  // namespace

Outcome run_simulated_hosts(const Config& base, int count) {
  Config shared = base;
  shared.etcd.keepalive = true;
  // One process, one address: nothing is served per host.
  shared.compute.metrics_listen.clear();
  shared.compute.metadata_interface.clear();
  const std::string prefix = base.compute.name.empty() ? compute::host_name() : base.compute.name;
  const std::filesystem::path root = base.compute.state_dir;
  std::vector<Config> configs(size_t(count), shared);  // each agent refers to its own
  for (int i = 0; i < count; ++i) {
    ComputeConfig& c = configs[size_t(i)].compute;
    c.name = fmt::format("{}-{:05d}", prefix, i + 1);
    c.state_dir = (root / c.name).string();
    c.instance_dir.clear();
    c.move_libvirt_uri = "memory:///" + c.name;  // its peers in this process reach it there
  }
  asio::io_context io(1);
  Servers servers(io, shared);
  AgentThreads threads(shared.compute.workers, shared.compute.max_concurrent_moves);
  std::vector<std::unique_ptr<ComputeAgent>> agents;  // outlive the loop
  agents.reserve(size_t(count));
  Outcome outcome =
      run_until_done(io, start_simulated(io, configs, servers, threads, std::make_shared<MemoryHosts>(), agents));
  threads.join();
  return outcome;
}

Outcome run_compute(const Config& base) {
  // libvirt's client writes to libvirtd's socket without MSG_NOSIGNAL: a libvirtd that
  // restarts must cost a reconnect, not the agent.
  std::signal(SIGPIPE, SIG_IGN);
  Config config = base;
  config.etcd.keepalive = true;
  asio::io_context io(1);
  Servers servers(io, config);
  AgentThreads threads(config.compute.workers, config.compute.max_concurrent_moves);
  std::unique_ptr<ComputeAgent> agent;  // outlives the loop
  Outcome outcome = run_until_done(io, start(io, config, servers, threads, agent));
  threads.join();
  return outcome;
}

}  // namespace toyvm
