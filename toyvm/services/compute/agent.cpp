// toyvm compute: the host agent. It registers the host in Placement under a stable provider
// uuid, announces itself in etcd under a lease, and reconciles the instances etcd says should
// run here with the domains libvirt has: on start, on every watch event, and after every
// reconnect. Each part lives in its own file of this folder; the agent owns them and wires
// them together.

#include "core/log.hpp"
#include "core/metrics.hpp"
#include "core/idle_pages.hpp"
#include "model/inventory.hpp"
#include "services/common.hpp"
#include "services/compute/builder.hpp"
#include "services/compute/context.hpp"
#include "services/compute/guest_metadata.hpp"
#include "services/compute/guest_observer.hpp"
#include "services/compute/maintenance.hpp"
#include "services/compute/mover.hpp"
#include "services/compute/presence.hpp"
#include "services/compute/instances.hpp"
#include "services/compute/recorder.hpp"
#include "services/compute/registration.hpp"
#include "services/compute/work_feed.hpp"
#include "services/metrics_http.hpp"
#include "services/placer.hpp"
#include "services/services.hpp"
#include "virt/images.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

namespace toyvm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace compute;

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

class ComputeAgent {
 public:
  ComputeAgent(asio::io_context& io, const Config& config)
      : config_(config),
        placement_(io.get_executor(), config_.placement),
        pool_(size_t(config_.compute.workers)),
        sends_(size_t(config_.compute.max_concurrent_moves)),
        virt_(pool_, &sends_),
        ctx_{io, config_, KeyLayout(config_.etcd.prefix), EtcdClient::create(config_.etcd), placement_, pool_, virt_, {}, {}, 0, {}},
        placer_(placement_, *ctx_.etcd, config_),
        recorder_(ctx_),
        instances_(ctx_),
        presence_(ctx_, [this] { return instances_.holding_work(); }),
        observer_(ctx_, instances_),
        metadata_(ctx_, instances_) {}

  ~ComputeAgent() {
    pool_.join();
    sends_.join();
  }

  awaitable<int> run() {
    asio::signal_set signals(ctx_.io, SIGINT, SIGTERM);
    signals.async_wait([this](const error_code& ec, int) {
      if (ec) return;
      spdlog::info("shutting down");
      ctx_.stop.request();
      if (feed_) feed_->stop();
      if (moves_) moves_->stop();
    });
    const std::string name = config_.compute.name.empty() ? host_name() : config_.compute.name;
    co_await adopt_provider_by_name(ctx_, config_.compute.state_dir, name);
    if (ctx_.stop.requested()) co_return 0;
    if (int code = prepare(); code != 0) co_return code;
    if (int code = serve_agent_metrics(); code != 0) co_return code;
    co_await ensure_network();
    spawn_detached(ctx_.io, metadata_.run(), "serving metadata");
    co_await maintenance_->load();
    co_await registration_->register_until_done();
    presence_.set_capacity(capacity_of(registration_->inventory()));
    if (!ctx_.stop.requested()) co_await presence_.announce();
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, presence_.keep_alive(), "keeping the lease alive");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, presence_.report_stats(), "reporting the host's figures");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, maintenance_->follow(), "following the operator's disable");
    // Moves first: a guest arriving here is no stranger to the first listing of the work.
    if (!ctx_.stop.requested()) co_await moves_->load();
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, moves_->follow(), "following moves");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, moves_->resync_periodically(), "resyncing moves");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, feed_->resync_periodically(), "resyncing");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, observer_.run(), "observing guests");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, observer_.watch_leases(), "watching leases");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, observer_.follow_console_requests(), "following console requests");
    if (!ctx_.stop.requested()) spawn_detached(ctx_.io, observer_.follow_usage_requests(), "following usage requests");
    spawn_detached(ctx_.io, release_pages_when_quiet(), "releasing idle pages");
    co_await feed_->follow();  // until a signal
    // The host record goes with the lease; the provider is marked disabled so that
    // schedulers spend no candidate on it; the next start sets the traits afresh (disabled
    // again if an operator disabled the host).
    co_await presence_.revoke();
    co_await registration_->mark_disabled();
    co_return 0;
  }

  // Start-up (registration, the first listing and reconcile, the first host record), each burst
  // of work (builds, deletions) and the periodic jobs (a resync a minute, the host's figures
  // every 30 s) run code that then lies idle for a long while. Once the agent has been quiet for
  // a few seconds, the pages of its executable and libraries are given back; what runs after
  // (the lease's keep-alive, timers) comes back.
  awaitable<void> release_pages_when_quiet() {
    uint64_t seen = ctx_.activity;
    std::optional<uint64_t> released_at;
    while (co_await ctx_.stop.sleep(3s)) {
      if (ctx_.activity != seen) {
        seen = ctx_.activity;  // still busy
        continue;
      }
      if (released_at == seen) continue;  // nothing ran since the last time
      release_idle_pages();
      released_at = seen;
    }
  }

 private:
  int prepare() {
    const ComputeConfig& c = config_.compute;
    auto uuid = load_or_create_provider_uuid(c.state_dir);
    if (!uuid) return report_failure(uuid.error());
    HostIdentity& host = ctx_.host;
    host.provider = *uuid;
    host.name = c.name.empty() ? host_name() : c.name;
    std::error_code ec;
    fs::path state_dir = fs::absolute(c.state_dir, ec);
    host.instance_dir =
        c.instance_dir.empty() ? (state_dir / "instances").string() : fs::absolute(c.instance_dir, ec).string();
    fs::create_directories(host.instance_dir, ec);
    // QEMU runs as its own user on qemu:///system and must reach instance files and images.
    fs::permissions(host.instance_dir, fs::perms(0755), ec);
    Inventory inventory;
    if (!c.inventory.empty()) {
      auto amounts = parse_resource_amounts(c.inventory);
      if (!amounts) return report_failure(amounts.error().doing("invalid --inventory"));
      inventory = inventory_from_amounts(*amounts);
    } else {
      auto facts = measure_host(host.instance_dir);
      if (!facts) return report_failure(facts.error().doing("cannot measure this host's resources"));
      inventory = inventory_from_host(*facts, c.policy);
    }
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string text((std::istreambuf_iterator<char>(cpuinfo)), std::istreambuf_iterator<char>());
    registration_ = std::make_unique<ProviderRegistration>(ctx_, std::move(inventory), cpu_traits(text));
    maintenance_ = std::make_unique<HostMaintenanceFollower>(ctx_, *registration_, presence_);
    ImageStoreOptions images;
    images.image_dir = c.image_dir.empty() ? (state_dir / "images").string() : c.image_dir;
    images.cache_dir = c.image_cache_dir.empty() ? (state_dir / "image-cache").string() : c.image_cache_dir;
    images.cache_max_bytes = uint64_t(c.image_cache_max_gb * double(1 << 30));
    images.max_download_bytes = uint64_t(c.image_max_gb * double(1 << 30));
    images.schemes = c.image_schemes;
    images.ca_file = c.image_ca_file;
    images_ = std::make_unique<ImageStore>(ctx_.io.get_executor(), pool_, std::move(images));
    LibvirtOptions libvirt{c.libvirt_uri, c.domain_type, host.instance_dir, c.network, c.bridge, c.nic_model,
                           c.guest_filter, host.provider};
    auto backend = open_libvirt(libvirt);
    if (!backend) return report_failure(backend.error());
    // A guest that stops, crashes or is killed outside toyvm is looked at at once; the
    // periodic resync remains the net for an event that is lost.
    (*backend)->on_lifecycle([this](const std::string& uuid, bool started) {
      asio::post(ctx_.io, [this, uuid, started] {
        instances_.observe(uuid, started);
      });
    });
    virt_.attach(std::move(*backend));
    builder_ = std::make_unique<Builder>(
        ctx_, Builder::Parts{recorder_, *images_, placer_, [this] { return instances_.images_wanted(); }});
    mover_ = std::make_unique<Mover>(ctx_, *builder_, placer_);
    instances_.attach(recorder_, *builder_, presence_, *mover_);
    feed_ = std::make_unique<KeyFeed>(
        ctx_, ctx_.keys.work_prefix(host.provider),
        KeyFeed::Handlers{[this](RangeResult listed) { return instances_.apply_listing(std::move(listed)); },
                          [this](const WatchEvent& event) { instances_.apply(event); }});
    moves_ = std::make_unique<KeyFeed>(
        ctx_, ctx_.keys.moves_prefix(),
        KeyFeed::Handlers{[this](RangeResult listed) { return instances_.apply_move_listing(std::move(listed)); },
                          [this](const WatchEvent& event) { instances_.apply_move(event); }});
    spdlog::info("provider {} ({}), libvirt {}", host.provider, host.name, c.libvirt_uri);
    return 0;
  }

  // Prometheus' /metrics, when asked for, with the instances by the state recorded here.
  int serve_agent_metrics() {
    const std::string& address = config_.compute.metrics_listen;
    if (address.empty()) return 0;
    if (auto served = serve_metrics(ctx_.io, address, config_.mdserver.listen); !served)
      return report_failure(served.error());
    metrics::on_render([this] {
      std::map<std::string, int> by_state;
      for (InstanceState state : {InstanceState::scheduled, InstanceState::building, InstanceState::active,
                                  InstanceState::stopped, InstanceState::error, InstanceState::deleting})
        by_state[std::string(to_string(state))] = 0;
      // Scrapes are answered on the event loop's thread, which the instances belong to.
      for (const auto& [uuid, instance] : instances_.all())
        if (auto state = recorded_state(instance->phase())) by_state[std::string(to_string(*state))] += 1;
      for (auto& [state, n] : by_state) metrics::set("toyvm_instances", n, {{"state", state}});
    });
    return 0;
  }

  // The guests' network first: its bridge is where the metadata address usually goes.
  awaitable<void> ensure_network() {
    auto network = co_await virt_(&VirtBackend::ensure_network);
    if (!network) spdlog::error("libvirt network {}: {}", config_.compute.network, network.error().message());
    // Told to guests in their network data; without it they still have what DHCP says.
    auto dns = co_await virt_(&VirtBackend::network_dns);
    if (dns) ctx_.guest_dns = *dns;
  }

  Config config_;
  PlacementClient placement_;
  asio::thread_pool pool_;
  asio::thread_pool sends_;  // guests sent to other hosts
  VirtCalls virt_;
  AgentContext ctx_;
  Placer placer_;
  InstanceRecorder recorder_;
  Instances instances_;
  HostPresence presence_;
  GuestObserver observer_;
  GuestMetadata metadata_;
  std::unique_ptr<ProviderRegistration> registration_;
  std::unique_ptr<HostMaintenanceFollower> maintenance_;
  std::unique_ptr<ImageStore> images_;
  std::unique_ptr<Builder> builder_;
  std::unique_ptr<Mover> mover_;
  std::unique_ptr<KeyFeed> feed_;   // this host's work
  std::unique_ptr<KeyFeed> moves_;  // guests moving, here or away
};

}  // namespace

int run_compute(const Config& base) {
  // libvirt's client writes to libvirtd's socket without MSG_NOSIGNAL: a libvirtd that
  // restarts must cost a reconnect, not the agent.
  std::signal(SIGPIPE, SIG_IGN);
  Config config = base;
  config.etcd.keepalive = true;
  asio::io_context io(1);
  ComputeAgent agent(io, config);  // outlives the loop: detached steps refer to it
  return run_until_done(io, agent.run());
}

}  // namespace toyvm
