// toyvm compute: the host agent. It registers the host in Placement under a stable provider
// uuid, announces itself in etcd under a lease, and reconciles the instances etcd says should
// run here with the domains libvirt has: on start, on every watch event, and after every
// reconnect. Each instance is reconciled by one coroutine at a time; instances run in parallel.

#include "clients/etcd.hpp"
#include "clients/http.hpp"
#include "clients/placement.hpp"
#include "model/candidates.hpp"
#include "core/log.hpp"
#include "model/groups.hpp"
#include "model/keys.hpp"
#include "model/reconcile.hpp"
#include "model/uuid.hpp"
#include "services/common.hpp"
#include "services/services.hpp"
#include "virt/backend.hpp"
#include "virt/host_network.hpp"
#include "virt/images.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace toyvm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The provider uuid lives in the state dir so that a restart never creates a second provider.
result<std::string> load_or_create_provider_uuid(const fs::path& state_dir, std::string* detail) {
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  fs::path file = state_dir / "provider_uuid";
  std::ifstream in(file);
  std::string uuid;
  if (in >> uuid) {
    if (is_uuid(uuid)) return uuid;
    *detail = fmt::format("{} does not hold a uuid; remove it to register a new provider", file.string());
    return errc::invalid_config;
  }
  uuid = new_uuid();
  fs::path tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp);
    out << uuid << '\n';
    if (!out.flush()) {
      *detail = fmt::format("cannot write {}", tmp.string());
      return errc::invalid_config;
    }
  }
  fs::rename(tmp, file, ec);
  if (ec) {
    *detail = fmt::format("cannot write {}: {}", file.string(), ec.message());
    return errc::invalid_config;
  }
  return uuid;
}

// Starts a process in a session of its own with its output in `log`; it is not waited for.
bool spawn_detached(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID);
  pid_t pid = 0;
  int error = posix_spawn(&pid, argv[0], &actions, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  errno = error;
  return error == 0;
}

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

class ComputeAgent {
 public:
  ComputeAgent(asio::io_context& io, const Config& config)
      : io_(io),
        config_(config),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        placement_(io.get_executor(), config.placement),
        pool_(size_t(config.compute.workers)) {}

  ~ComputeAgent() { pool_.join(); }

  awaitable<int> run() {
    if (int code = prepare(); code != 0) co_return code;
    asio::signal_set signals(io_, SIGINT, SIGTERM);
    signals.async_wait([this](const error_code& ec, int) {
      if (ec) return;
      spdlog::info("shutting down");
      stopping_ = true;
      if (watch_) watch_->cancel();
    });
    co_await ensure_metadata_service();
    co_await register_provider();
    if (!stopping_) co_await announce();
    if (!stopping_) asio::co_spawn(io_, keep_lease_alive(), asio::detached);
    if (!stopping_) asio::co_spawn(io_, resync_periodically(), asio::detached);
    if (!stopping_) asio::co_spawn(io_, observe_guests(), asio::detached);
    co_await watch_work();  // until a signal
    co_await shutdown();
    co_return 0;
  }

 private:
  struct Slot {
    std::optional<WorkSpec> desired;
    int64_t revision = 0;       // etcd revision of what `desired` reflects; older news is stale
    std::optional<InstanceState> recorded;
    bool busy = false;
    bool dirty = false;
    std::string ip;             // the guest's address once libvirt knows it
    std::chrono::steady_clock::time_point address_deadline;  // stop looking for it then
    bool address_given_up = false;  // the deadline passed without one: recorded, so --wait ends
    int64_t console_published = -1;  // console log size last put in etcd
    asio::steady_timer* waiting = nullptr;  // a build waiting for its image; cancelled on destroy
  };

  // Destroy requested (or the work gone): a build in progress stops at its next step.
  bool cancelled(const std::string& uuid) {
    const Slot& slot = slots_[uuid];
    return !slot.desired || slot.desired->power == PowerState::deleted;
  }

  int prepare() {
    const ComputeConfig& c = config_.compute;
    std::string detail;
    auto uuid = load_or_create_provider_uuid(c.state_dir, &detail);
    if (!uuid) return report_failure(uuid.error(), detail);
    provider_ = *uuid;
    name_ = c.name.empty() ? host_name() : c.name;
    std::error_code ec;
    fs::path state_dir = fs::absolute(c.state_dir, ec);
    instance_dir_ = c.instance_dir.empty() ? (state_dir / "instances").string() : fs::absolute(c.instance_dir, ec).string();
    fs::create_directories(instance_dir_, ec);
    // QEMU runs as its own user on qemu:///system and must reach instance files and images.
    fs::permissions(instance_dir_, fs::perms(0755), ec);
    if (!c.inventory.empty()) {
      auto amounts = parse_resource_amounts(c.inventory, &detail);
      if (!amounts) return report_failure(amounts.error(), "invalid --inventory: " + detail);
      inventory_ = inventory_from_amounts(*amounts);
    } else {
      auto facts = measure_host(instance_dir_);
      if (!facts) return report_failure(facts.error(), "cannot measure this host's resources");
      inventory_ = inventory_from_host(*facts, c.policy);
    }
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string text((std::istreambuf_iterator<char>(cpuinfo)), std::istreambuf_iterator<char>());
    cpu_traits_ = cpu_traits(text);
    ImageStoreOptions images;
    images.image_dir = c.image_dir.empty() ? (state_dir / "images").string() : c.image_dir;
    images.cache_dir = c.image_cache_dir.empty() ? (state_dir / "image-cache").string() : c.image_cache_dir;
    images.cache_max_bytes = uint64_t(c.image_cache_max_gb * double(1 << 30));
    images.max_download_bytes = uint64_t(c.image_max_gb * double(1 << 30));
    images.schemes = c.image_schemes;
    images.ca_file = c.image_ca_file;
    images_ = std::make_unique<ImageStore>(io_.get_executor(), pool_, std::move(images));
    LibvirtOptions libvirt{c.libvirt_uri, c.domain_type, instance_dir_, c.network, c.bridge, c.nic_model};
    auto virt = open_libvirt(libvirt, &detail);
    if (!virt) return report_failure(virt.error(), detail);
    virt_ = std::move(*virt);
    spdlog::info("provider {} ({}), libvirt {}", provider_, name_, c.libvirt_uri);
    return 0;
  }

  // A backend call on the worker pool (libvirt blocks). The lambda is a named local because
  // GCC 12 mishandles capturing lambdas inside co_await expressions.
  template <class R, class... Params, class... Args>
  awaitable<R> virt(R (VirtBackend::*method)(Params...), Args... args) {
    auto call = [backend = virt_.get(), method, args...] { return (backend->*method)(args...); };
    co_return co_await run_blocking(pool_, std::move(call));
  }

  // With [compute] metadata_interface set, guests reach the metadata service through this host:
  // its address goes on that interface, and if nothing answers there an mdserver is started
  // (in its own session, so it outlives a restart of the agent).
  awaitable<void> ensure_metadata_service() {
    // The guests' network first: its bridge is where the metadata address usually goes.
    auto network = co_await virt(&VirtBackend::ensure_network);
    if (!network) spdlog::error("libvirt network {}: {}", config_.compute.network, network.failure->message);
    const std::string& interface = config_.compute.metadata_interface;
    if (interface.empty() || config_.mdserver.listen.empty()) co_return;
    const std::string listen = config_.mdserver.listen.front();
    const std::string address = listen.substr(0, listen.rfind(':'));
    std::string detail;
    if (!add_interface_address(interface, address, &detail)) {
      spdlog::error("metadata service: {}", detail);
      co_return;
    }
    if (co_await answers_http(address, listen.substr(listen.rfind(':') + 1))) {
      spdlog::info("metadata service answers on {}", listen);
      co_return;
    }
    std::error_code ec;
    std::vector<std::string> args{fs::read_symlink("/proc/self/exe", ec).string()};  // named in ps
    if (!config_.source_file.empty()) args.insert(args.end(), {"--config", config_.source_file});
    args.insert(args.end(), {"--etcd", fmt::format("{}", fmt::join(config_.etcd.endpoints, ",")),
                             "mdserver", "--listen", listen});
    std::string log = config_.compute.state_dir + "/mdserver.log";
    if (spawn_detached(args, log)) {
      spdlog::info("started toyvm mdserver on {} (log: {})", listen, log);
    } else {
      spdlog::error("cannot start toyvm mdserver: {}", std::strerror(errno));
    }
  }

  awaitable<bool> answers_http(std::string host, std::string port) {
    HttpClient http(io_.get_executor(), HttpClientOptions{"http://" + host + ":" + port, 1000ms});
    HttpRequest probe{"GET", "/", {}, {}};
    auto response = co_await http.request(std::move(probe));
    co_return bool(response);  // any answer, even 404 for this host's own address
  }

  // Waits with capped exponential backoff; used wherever a server may come back.
  awaitable<void> backoff(std::chrono::milliseconds& delay) {
    asio::steady_timer timer(io_, delay);
    co_await timer.async_wait(use_awaitable);
    delay = std::min<std::chrono::milliseconds>(delay * 2, 5s);
  }

  awaitable<void> register_provider() {
    std::chrono::milliseconds delay = 100ms;
    while (!stopping_ && !co_await register_once()) {
      spdlog::warn("registering provider {} in Placement: {}; retrying", provider_,
                   placement_.last_error().detail);
      co_await backoff(delay);
    }
    spdlog::info("registered provider {} with inventory {}", provider_,
                 format_amounts(capacity_of(inventory_)));
  }

  // The provider, its inventory, traits and zone, each call idempotent.
  awaitable<result<void>> register_once() {
    auto created = co_await placement_.ensure_provider(provider_, name_);
    if (!created) co_return created;
    auto inventory = co_await placement_.set_inventory(provider_, inventory_);
    if (!inventory) co_return inventory;
    // Only the CPU traits this Placement knows: an unknown standard trait is refused.
    auto known = co_await placement_.known_traits("HW_CPU_X86_");
    if (!known) co_return known.error();
    traits_ = config_.compute.traits;
    for (const std::string& trait : cpu_traits_)
      if (std::find(known->begin(), known->end(), trait) != known->end()) traits_.push_back(trait);
    auto traits_set = co_await placement_.set_traits(provider_, traits_);  // also clears DISABLED
    if (!traits_set) co_return traits_set;
    std::vector<std::string> aggregates;
    if (!config_.compute.availability_zone.empty())
      aggregates.push_back(availability_zone_aggregate(config_.compute.availability_zone));
    co_return co_await placement_.set_aggregates(provider_, std::move(aggregates));
  }

  // CIAO's READY/FULL: FULL once the host has max_instances instances (0: no limit).
  bool full() const {
    int limit = config_.compute.max_instances;
    return limit > 0 && instance_count() >= size_t(limit);
  }

  size_t instance_count() const {
    size_t n = 0;
    for (auto& [uuid, slot] : slots_)
      if (slot.desired && slot.desired->power != PowerState::deleted) ++n;
    return n;
  }

  HostRecord host_record() const {
    HostRecord record;
    record.name = name_;
    record.provider = provider_;
    record.capacity = capacity_of(inventory_);
    record.agent_version = TOYVM_VERSION;
    record.started_at = started_at_;
    record.domains = domain_count_;
    record.status = full() ? "FULL" : "READY";
    return record;
  }

  // Grants a lease and puts the host record under it; retried until etcd answers.
  awaitable<void> announce() {
    std::chrono::milliseconds delay = 100ms;
    while (!stopping_) {
      auto lease = co_await etcd_->lease_grant(config_.compute.lease_ttl_s);
      if (lease) {
        auto put = co_await etcd_->put(keys_.host(provider_), encode(host_record()), *lease);
        if (put) {
          lease_ = *lease;
          co_return;
        }
      }
      spdlog::warn("announcing host in etcd at {}: unavailable; retrying", etcd_->endpoints_text());
      co_await backoff(delay);
    }
  }

  // Re-puts the host record with a fresh domain count. Calls coalesce: under a burst of
  // builds one put is in flight and at most one more follows it.
  void publish_host() {
    host_dirty_ = true;
    if (host_publishing_ || !lease_) return;
    host_publishing_ = true;
    asio::co_spawn(io_, publish_host_loop(), asio::detached);
  }

  awaitable<void> publish_host_loop() {
    while (host_dirty_ && !stopping_) {
      host_dirty_ = false;
      auto domains = co_await virt(&VirtBackend::list);
      if (domains) domain_count_ = int64_t(domains.value.size());
      co_await etcd_->put(keys_.host(provider_), encode(host_record()), lease_);
    }
    host_publishing_ = false;
  }

  awaitable<void> keep_lease_alive() {
    asio::steady_timer timer(io_);
    auto interval = std::chrono::milliseconds(config_.compute.lease_ttl_s * 1000 / 3);
    while (!stopping_) {
      auto keeper = etcd_->keep_alive(lease_);
      while (!stopping_) {
        auto ttl = co_await keeper->ping();
        if (!ttl || *ttl <= 0) break;
        timer.expires_after(interval);
        co_await timer.async_wait(asio::as_tuple(use_awaitable));
      }
      if (stopping_) break;
      spdlog::warn("lost the etcd lease; announcing the host again");
      co_await announce();
    }
  }

  // Lists the work prefix, reconciles everything, then follows the watch from the listed
  // revision. A broken stream or a compacted revision leads back to a fresh list.
  awaitable<void> watch_work() {
    std::chrono::milliseconds delay = 100ms;
    const std::string prefix = keys_.work_prefix(provider_);
    while (!stopping_) {
      auto listed = co_await etcd_->range_prefix(prefix);
      if (!listed) {
        spdlog::warn("listing {} in etcd: {}; retrying", prefix, listed.error().message());
        co_await backoff(delay);
        continue;
      }
      co_await reconcile_listing(*listed);
      watch_ = etcd_->watch(WatchOptions{prefix, prefix_range_end(prefix), listed->revision + 1, false});
      while (!stopping_) {
        WatchBatch batch = co_await watch_->next();
        if (batch.error || batch.canceled || batch.compact_revision) {
          if (!stopping_)
            spdlog::warn("watch on {} ended ({}); listing again", prefix,
                         batch.compact_revision ? "compacted" : batch.error.message());
          break;
        }
        delay = 100ms;
        for (WatchEvent& event : batch.events) on_event(event);
      }
      watch_.reset();
      if (!stopping_) co_await backoff(delay);
    }
  }

  // Level-triggered safety net: whatever a lost event or a failed step left behind, a full
  // list every resync_interval puts right (every step is idempotent).
  awaitable<void> resync_periodically() {
    asio::steady_timer timer(io_);
    while (!stopping_) {
      timer.expires_after(std::chrono::milliseconds(int64_t(config_.compute.resync_interval_s * 1000)));
      co_await timer.async_wait(asio::as_tuple(use_awaitable));
      if (stopping_) break;
      auto listed = co_await etcd_->range_prefix(keys_.work_prefix(provider_));
      if (listed) co_await reconcile_listing(*listed);
    }
  }

  awaitable<void> reconcile_listing(const RangeResult& listed) {
    std::map<std::string, bool> seen;
    for (const KeyValue& kv : listed.kvs) {
      WatchEvent event{WatchEvent::Type::put, kv, std::nullopt};
      if (auto uuid = on_event(event)) seen[*uuid] = true;
    }
    // Work that vanished while we were not watching (and did not appear after the listing),
    // and domains nobody asked for.
    for (auto& [uuid, slot] : slots_) {
      if (!seen.count(uuid) && slot.desired && slot.revision <= listed.revision) {
        slot.desired.reset();
        kick(uuid);
      }
    }
    auto domains = co_await virt(&VirtBackend::list);
    for (const std::string& uuid : domains.value) {
      if (!seen.count(uuid) && !slots_.count(uuid)) kick(uuid);
    }
    publish_host();
  }

  // Returns the instance uuid the event was about, if it was one of ours.
  std::optional<std::string> on_event(const WatchEvent& event) {
    auto key = keys_.parse_work(event.kv.key);
    if (!key || key->host != provider_) {
      spdlog::warn("ignoring key {} under the work prefix", event.kv.key);
      return std::nullopt;
    }
    Slot& slot = slots_[key->instance];
    // A listing taken before a watch event must not undo it (periodic resync runs alongside).
    if (event.kv.mod_revision < slot.revision) return key->instance;
    slot.revision = event.kv.mod_revision;
    if (event.type == WatchEvent::Type::erase) {
      slot.desired.reset();
    } else {
      std::string detail;
      auto spec = decode_work(event.kv.value, &detail);
      if (!spec || spec->uuid != key->instance) {
        spdlog::error("ignoring work {}: {}", event.kv.key, spec ? "uuid does not match the key" : detail);
        if (!slot.busy && !slot.desired) slots_.erase(key->instance);
        return std::nullopt;
      }
      slot.desired = std::move(*spec);
    }
    if (slot.waiting && cancelled(key->instance)) slot.waiting->cancel();
    kick(key->instance);
    return key->instance;
  }

  void kick(const std::string& uuid) {
    Slot& slot = slots_[uuid];
    if (slot.busy) {
      slot.dirty = true;
      return;
    }
    slot.busy = true;
    asio::co_spawn(io_, reconcile_loop(uuid), asio::detached);
  }

  awaitable<void> reconcile_loop(std::string uuid) {
    while (true) {
      slots_[uuid].dirty = false;
      bool settled = co_await reconcile_once(uuid);
      Slot& slot = slots_[uuid];
      if (!settled && !slot.dirty && !stopping_) {
        // A step failed on a server that may come back: try again later.
        asio::steady_timer timer(io_, retry_delay_);
        co_await timer.async_wait(use_awaitable);
        slot.dirty = true;
      }
      Slot& after = slots_[uuid];
      if (!after.dirty || stopping_) {
        after.busy = false;
        if (!after.desired) slots_.erase(uuid);
        co_return;
      }
    }
  }

  // One step towards the desired state; false when it must be retried.
  awaitable<bool> reconcile_once(std::string uuid) {
    Slot& slot = slots_[uuid];
    std::optional<WorkSpec> desired = slot.desired;
    auto actual = co_await virt(&VirtBackend::state, uuid);
    if (!actual) {
      spdlog::error("instance {}: libvirt: {}", uuid, actual.failure->message);
      co_return false;
    }
    ReconcileAction action = decide(desired ? &*desired : nullptr, actual.value, slots_[uuid].recorded);
    switch (action) {
      case ReconcileAction::none: co_return true;
      case ReconcileAction::build: co_return co_await build(*desired);
      case ReconcileAction::start: co_return co_await power(*desired, true);
      case ReconcileAction::stop: co_return co_await power(*desired, false);
      case ReconcileAction::record_active:
        co_return co_await record(*desired, InstanceState::active);
      case ReconcileAction::record_stopped:
        co_return co_await record(*desired, InstanceState::stopped);
      case ReconcileAction::remove: co_return co_await remove(*desired);
      case ReconcileAction::remove_domain: {
        auto gone = co_await virt(&VirtBackend::destroy, uuid);
        if (!gone) spdlog::error("instance {}: destroying: {}", uuid, gone.failure->message);
        publish_host();
        co_return bool(gone);
      }
    }
    co_return true;
  }

  InstanceRecord instance_record(const WorkSpec& spec, InstanceState state) {
    InstanceRecord record;
    record.uuid = spec.uuid;
    record.name = spec.name;
    record.host = provider_;
    record.state = state;
    if (state == InstanceState::active) {
      record.ip = slots_[spec.uuid].ip;
      record.no_address = slots_[spec.uuid].address_given_up;
    }
    const bool has_nic = !config_.compute.network.empty() || !config_.compute.bridge.empty();
    if (has_nic && (state == InstanceState::active || state == InstanceState::stopped))
      record.mac = instance_mac(spec.uuid);
    record.updated_at = unix_millis();
    return record;
  }

  // Writes the observed state only while the work key still exists, so a late write never
  // resurrects an instance that was removed meanwhile.
  awaitable<bool> write_instance(const InstanceRecord& record) {
    // (Vectors built outside co_await: GCC 12 miscompiles initializer lists inside it.)
    std::vector<EtcdCompare> compare{EtcdCompare::present(keys_.work(provider_, record.uuid))};
    std::vector<EtcdOp> ops{EtcdOp::put(keys_.instance(record.uuid), encode(record))};
    auto txn = co_await etcd_->txn(std::move(compare), std::move(ops));
    if (!txn) {
      spdlog::warn("instance {}: recording {}: {}", record.uuid, to_string(record.state),
                   txn.error().message());
      co_return false;
    }
    Slot& slot = slots_[record.uuid];
    slot.recorded = record.state;
    co_return true;
  }

  awaitable<bool> record(const WorkSpec& spec, InstanceState state) {
    Slot& slot = slots_[spec.uuid];
    if (state == InstanceState::active && slot.recorded != InstanceState::active) {
      // A guest that just started gets an address from DHCP: look for it until the deadline.
      slot.address_deadline = std::chrono::steady_clock::now() +
                              std::chrono::milliseconds(int64_t(config_.compute.address_timeout_s * 1000));
      slot.address_given_up = false;
    }
    if (state != InstanceState::active) slot.ip.clear();
    co_return co_await write_instance(instance_record(spec, state));
  }

  DomainSpec domain_spec(const WorkSpec& spec, const BootImage& image) const {
    DomainSpec d;
    d.uuid = spec.uuid;
    d.name = spec.name.empty() ? spec.uuid : spec.name;
    auto amount = [&](const char* rc, int64_t fallback) {
      auto it = spec.resources.find(rc);
      return it == spec.resources.end() ? fallback : it->second;
    };
    d.vcpus = amount("VCPU", 1);
    d.memory_mb = amount("MEMORY_MB", 128);
    d.disk_gb = amount("DISK_GB", 0);
    d.image = image;
    d.mac = instance_mac(spec.uuid);
    return d;
  }

  awaitable<bool> build(WorkSpec spec) {
    int limit = config_.compute.max_instances;
    if (limit > 0 && instance_count() > size_t(limit))
      co_return co_await fail_build(spec, "full_cn", fmt::format("host {} is full ({} instances)", name_, limit));
    if (!spec.group.empty()) {
      auto allowed = co_await group_allows_here(spec);
      if (!allowed) co_return false;
      if (!*allowed) co_return co_await fail_build(spec, "no_valid_host",
                                                   fmt::format("server group {} ({}) does not allow this host",
                                                               spec.group, spec.group_policy));
    }
    spdlog::info("instance {}: building with image {} and {}", spec.uuid, spec.image,
                 format_amounts(spec.resources));
    if (!co_await record(spec, InstanceState::building)) co_return false;
    BootImage image;
    if (!spec.image.empty()) {
      auto acquired = co_await acquire_image(spec);
      // Destroyed while waiting: the next round removes what there is.
      if (!acquired || cancelled(spec.uuid)) co_return true;
      if (!*acquired) co_return co_await fail_build(spec, acquired->failure->reason, acquired->failure->message);
      image = acquired->value;
    }
    if (cancelled(spec.uuid)) co_return true;
    DomainSpec domain = domain_spec(spec, image);
    auto created = co_await virt(&VirtBackend::create, domain);
    if (!created) {
      // The domain may be half-made; nothing of a failed build stays behind.
      co_await virt(&VirtBackend::destroy, spec.uuid);
      co_return co_await fail_build(spec, created.failure->reason, created.failure->message);
    }
    spdlog::info("instance {}: active", spec.uuid);
    publish_host();
    co_return co_await record(spec, InstanceState::active);
  }

  // Waits for the image (fetched once however many builds want it); nullopt when the build
  // was cancelled meanwhile.
  awaitable<std::optional<VirtResult<BootImage>>> acquire_image(const WorkSpec& spec) {
    asio::steady_timer wake(io_, std::chrono::steady_clock::time_point::max());
    slots_[spec.uuid].waiting = &wake;
    auto acquired = co_await images_->acquire(spec.image, spec.image_sha256, wake);
    slots_[spec.uuid].waiting = nullptr;
    if (acquired && *acquired && !images_->cache_path(spec.image).empty()) {
      auto trim = [this, in_use = images_in_use()] { images_->trim(in_use); return true; };
      co_await run_blocking(pool_, std::move(trim));
    }
    co_return acquired;
  }

  std::set<std::string> images_in_use() {
    std::set<std::string> paths;
    for (auto& [uuid, slot] : slots_)
      if (slot.desired) paths.insert(images_->cache_path(slot.desired->image));
    return paths;
  }

  // ERROR with a reason code; the allocation and the group membership are given back.
  // A build that failed here may succeed elsewhere (Nova's alternates): the instance moves
  // to another live host while attempts remain; after the last it is ERROR no_valid_host.
  // A bad image is bad everywhere: image_failure is final at once (Nova's BuildAbort).
  awaitable<bool> fail_build(const WorkSpec& spec, std::string reason, std::string message) {
    spdlog::error("instance {}: {}: {}", spec.uuid, reason, message);
    if (reason != "image_failure") {
      if (spec.attempt < config_.compute.max_build_attempts) {
        auto moved = co_await move_elsewhere(spec);
        if (moved && *moved) co_return true;
        if (!moved) co_return false;  // a server did not answer: the whole step is retried
      }
      message = fmt::format("no host could build it in {} attempt(s); the last said {}: {}", spec.attempt, reason,
                            message);
      reason = "no_valid_host";
    }
    InstanceRecord failed = instance_record(spec, InstanceState::error);
    failed.error_code = std::move(reason);
    failed.error_message = std::move(message);
    bool released = bool(co_await placement_.release(spec.uuid));
    if (!spec.group.empty()) co_await etcd_->erase(keys_.group_member(spec.group, spec.uuid));
    co_return co_await write_instance(failed) && released;
  }

  // Claims the instance on another live host and moves its work there in one transaction.
  // false: no other host fits; an error: Placement or etcd did not answer.
  awaitable<result<bool>> move_elsewhere(const WorkSpec& spec) {
    auto query = parse_placement_query(spec.query, nullptr);
    if (!query) co_return false;
    query->params.emplace_back("required", "!COMPUTE_STATUS_DISABLED");
    auto candidates = co_await placement_.allocation_candidates(query->to_query_string(config_.placement.candidate_limit));
    if (!candidates) co_return result<bool>(boost::system::in_place_error, candidates.error());
    auto hosts = co_await etcd_->range_prefix(keys_.hosts_prefix());
    if (!hosts) co_return result<bool>(boost::system::in_place_error, hosts.error());
    std::set<std::string> live;
    for (const KeyValue& kv : hosts->kvs) {
      auto host = decode_host(kv.value);
      if (host && host->status == "READY" && host->provider != provider_) live.insert(host->provider);
    }
    // The allocation moves with the instance: give this host's back, then claim there.
    auto released = co_await placement_.release(spec.uuid);
    if (!released) co_return result<bool>(boost::system::in_place_error, released.error());
    std::vector<Choice> choices = rank_candidates(*candidates, live);
    if (!spec.group.empty()) {
      auto policy = parse_group_policy(spec.group_policy);
      auto members = co_await etcd_->range_prefix(keys_.group_prefix(spec.group));
      if (!members) co_return result<bool>(boost::system::in_place_error, members.error());
      std::map<std::string, int> per_host;
      for (const KeyValue& kv : members->kvs) {
        auto member = decode_group_member(kv.value);
        if (member && keys_.leaf(kv.key, keys_.group_prefix(spec.group)) != spec.uuid) per_host[member->host] += 1;
      }
      if (policy) choices = filter_for_group(std::move(choices), *policy, per_host);
    }
    for (const Choice& choice : choices) {
      auto claimed = co_await placement_.claim(spec.uuid, *choice.allocations);
      if (!claimed) continue;
      WorkSpec moved = spec;
      moved.attempt = spec.attempt + 1;
      moved.resources = choice.allocations->at(choice.host);
      InstanceRecord record = instance_record(moved, InstanceState::scheduled);
      record.host = choice.host;
      const std::string here = keys_.work(provider_, spec.uuid);
      std::vector<EtcdCompare> unchanged{EtcdCompare::present(here)};
      std::vector<EtcdOp> move{EtcdOp::erase(here), EtcdOp::put(keys_.work(choice.host, spec.uuid), encode(moved)),
                               EtcdOp::put(keys_.instance(spec.uuid), encode(record))};
      if (!spec.group.empty())
        move.push_back(EtcdOp::put(keys_.group_member(spec.group, spec.uuid),
                                   encode_group_member(choice.host, *parse_group_policy(spec.group_policy))));
      auto txn = co_await etcd_->txn(std::move(unchanged), std::move(move));
      if (txn && txn->succeeded) {
        spdlog::info("instance {}: moved to host {} for attempt {}", spec.uuid, choice.host, moved.attempt);
        co_return true;
      }
      co_await placement_.release(spec.uuid);
      if (!txn) co_return result<bool>(boost::system::in_place_error, txn.error());
      co_return true;  // the work key is gone here (destroyed meanwhile): nothing left to do
    }
    co_return false;
  }

  // Nova's late check: concurrent schedules may have put members of a hard group against
  // its policy; the member created later gives way.
  awaitable<result<bool>> group_allows_here(const WorkSpec& spec) {
    auto policy = parse_group_policy(spec.group_policy);
    if (!policy) co_return true;
    auto listed = co_await etcd_->range_prefix(keys_.group_prefix(spec.group));
    if (!listed) co_return result<bool>(boost::system::in_place_error, listed.error());
    std::vector<GroupMember> members;
    for (const KeyValue& kv : listed->kvs) {
      auto member = decode_group_member(kv.value);
      auto instance = keys_.leaf(kv.key, keys_.group_prefix(spec.group));
      // mod_revision: a member that moved to another host counts from its move.
      if (member && instance) members.push_back(GroupMember{*instance, member->host, kv.mod_revision});
    }
    co_return group_allows(*policy, members, spec.uuid, provider_);
  }

  awaitable<bool> power(WorkSpec spec, bool on) {
    if (!on) co_await shut_down_gracefully(spec.uuid);
    auto done = co_await virt(on ? &VirtBackend::start : &VirtBackend::stop, spec.uuid);
    if (!done) {
      spdlog::error("instance {}: {}", spec.uuid, done.failure->message);
      co_return false;
    }
    co_return co_await record(spec, on ? InstanceState::active : InstanceState::stopped);
  }

  // Asks the guest to power off and waits up to stop_timeout for it; stop() then pulls the plug.
  awaitable<void> shut_down_gracefully(std::string uuid) {
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(int64_t(config_.compute.stop_timeout_s * 1000));
    if (config_.compute.stop_timeout_s <= 0 || !co_await virt(&VirtBackend::shutdown, uuid)) co_return;
    asio::steady_timer timer(io_);
    while (std::chrono::steady_clock::now() < deadline && !stopping_) {
      timer.expires_after(250ms);
      co_await timer.async_wait(asio::as_tuple(use_awaitable));
      auto state = co_await virt(&VirtBackend::state, uuid);
      if (!state || state.value != DomainState::running) co_return;
    }
    spdlog::info("instance {}: did not power off within {} s; forcing it off", uuid, config_.compute.stop_timeout_s);
  }

  // Looks for new guests' addresses twice a second (libvirt has no event for a DHCP lease),
  // and publishes grown console logs every console_interval.
  awaitable<void> observe_guests() {
    asio::steady_timer timer(io_);
    auto console_every = std::chrono::milliseconds(int64_t(config_.compute.console_interval_s * 1000));
    auto next_console = std::chrono::steady_clock::now();
    while (!stopping_) {
      timer.expires_after(console_every.count() > 0 ? std::min<std::chrono::milliseconds>(500ms, console_every) : 500ms);
      co_await timer.async_wait(asio::as_tuple(use_awaitable));
      auto now = std::chrono::steady_clock::now();
      std::vector<std::string> looking, given_up, consoles;
      const bool has_nic = !config_.compute.network.empty() || !config_.compute.bridge.empty();
      for (auto& [uuid, slot] : slots_) {
        if (!slot.desired || slot.busy) continue;
        if (has_nic && slot.recorded == InstanceState::active && slot.ip.empty() && !slot.address_given_up)
          (now < slot.address_deadline ? looking : given_up).push_back(uuid);
        if (slot.recorded == InstanceState::active || slot.recorded == InstanceState::stopped) consoles.push_back(uuid);
      }
      for (const std::string& uuid : looking) co_await find_address(uuid);
      for (const std::string& uuid : given_up) co_await give_up_address(uuid);
      if (console_every.count() > 0 && now >= next_console) {
        next_console = now + console_every;
        if (!consoles.empty()) co_await publish_consoles(consoles);
      }
    }
  }

  awaitable<void> find_address(std::string uuid) {
    auto found = co_await virt(&VirtBackend::addresses, uuid);
    if (!found || found.value.empty()) co_return;
    Slot& slot = slots_[uuid];
    if (!slot.desired || slot.busy || slot.recorded != InstanceState::active) co_return;
    const std::string mac = instance_mac(uuid);
    slot.ip = found.value.front().ip;
    for (const GuestAddress& address : found.value)
      if (address.mac == mac) slot.ip = address.ip;
    spdlog::info("instance {}: address {}", uuid, slot.ip);
    WorkSpec spec = *slot.desired;
    co_await write_instance(instance_record(spec, InstanceState::active));
  }

  // Recorded so that whoever waits for the address stops waiting.
  awaitable<void> give_up_address(std::string uuid) {
    Slot& slot = slots_[uuid];
    if (!slot.desired || slot.busy || slot.recorded != InstanceState::active || !slot.ip.empty()) co_return;
    slot.address_given_up = true;
    spdlog::warn("instance {}: no address within address_timeout ({} s); no longer looking", uuid,
                 config_.compute.address_timeout_s);
    WorkSpec spec = *slot.desired;
    co_await write_instance(instance_record(spec, InstanceState::active));
  }

  // The last 16 KiB of each serial console that has grown, put in etcd so that
  // `toyvm show --console` works from any host. One trip to the worker pool reads them all.
  awaitable<void> publish_consoles(const std::vector<std::string>& uuids) {
    struct Tail {
      std::string uuid;
      int64_t size = 0;
      std::string text;
    };
    std::vector<std::pair<std::string, int64_t>> logs;  // uuid, size last published
    for (const std::string& uuid : uuids) logs.emplace_back(uuid, slots_[uuid].console_published);
    auto read_tails = [dir = instance_dir_, logs = std::move(logs)] {
      std::vector<Tail> grown;
      for (const auto& [uuid, published] : logs) {
        const std::string path = console_log_path(dir, uuid);
        std::error_code ec;
        auto size = int64_t(fs::file_size(path, ec));
        if (ec || size == published) continue;
        std::ifstream in(path, std::ios::binary);
        constexpr int64_t tail = 16 * 1024;
        in.seekg(std::max<int64_t>(0, size - tail));
        std::string text(size_t(std::min(size, tail)), '\0');
        in.read(text.data(), std::streamsize(text.size()));
        text.resize(size_t(in.gcount()));
        grown.push_back(Tail{uuid, size, std::move(text)});
      }
      return grown;
    };
    std::vector<Tail> grown = co_await run_blocking(pool_, std::move(read_tails));
    for (Tail& tail : grown) {
      std::vector<EtcdCompare> compare{EtcdCompare::present(keys_.work(provider_, tail.uuid))};
      std::vector<EtcdOp> ops{EtcdOp::put(keys_.console(tail.uuid), std::move(tail.text))};
      auto put = co_await etcd_->txn(std::move(compare), std::move(ops));
      if (put && put->succeeded) slots_[tail.uuid].console_published = tail.size;
    }
  }

  // Domain first, then the allocation, then the keys: if any step fails the keys stay, and
  // the next attempt finishes the job, so nothing leaks in Placement.
  awaitable<bool> remove(WorkSpec spec) {
    auto gone = co_await virt(&VirtBackend::destroy, spec.uuid);
    if (!gone) {
      spdlog::error("instance {}: destroying: {}", spec.uuid, gone.failure->message);
      co_return false;
    }
    auto released = co_await placement_.release(spec.uuid);
    if (!released) {
      spdlog::warn("instance {}: releasing its allocation: {}; will retry", spec.uuid,
                   placement_.last_error().detail);
      co_return false;
    }
    std::string work_key = keys_.work(provider_, spec.uuid);
    std::vector<EtcdOp> ops{EtcdOp::erase(work_key), EtcdOp::erase(keys_.instance(spec.uuid)),
                            EtcdOp::erase(keys_.console(spec.uuid))};
    if (!spec.group.empty()) ops.push_back(EtcdOp::erase(keys_.group_member(spec.group, spec.uuid)));
    auto erased = co_await etcd_->txn({}, std::move(ops));
    if (!erased) co_return false;
    spdlog::info("instance {}: deleted", spec.uuid);
    publish_host();
    co_return true;
  }

  // The host record goes with the lease; the provider is marked disabled so that schedulers
  // spend no candidate on it; the next start sets the traits afresh, without the mark.
  awaitable<void> shutdown() {
    if (lease_) co_await etcd_->lease_revoke(lease_);
    std::vector<std::string> disabled = traits_;
    disabled.push_back("COMPUTE_STATUS_DISABLED");
    if (!co_await placement_.set_traits(provider_, std::move(disabled)))
      spdlog::warn("could not mark provider {} disabled: {}", provider_, placement_.last_error().detail);
  }


  asio::io_context& io_;
  Config config_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  PlacementClient placement_;
  asio::thread_pool pool_;
  std::unique_ptr<VirtBackend> virt_;
  std::unique_ptr<ImageStore> images_;
  std::string instance_dir_;
  std::string provider_;
  std::string name_;
  Inventory inventory_;
  std::vector<std::string> cpu_traits_;
  std::vector<std::string> traits_;  // as last set in Placement
  int64_t lease_ = 0;
  int64_t started_at_ = unix_seconds();
  int64_t domain_count_ = 0;
  bool host_dirty_ = false;
  bool host_publishing_ = false;
  std::map<std::string, Slot> slots_;
  std::unique_ptr<EtcdWatch> watch_;
  std::chrono::milliseconds retry_delay_ = 1s;
  bool stopping_ = false;
};

}  // namespace

int run_compute(const Config& base) {
  Config config = base;
  config.etcd.keepalive = true;
  asio::io_context io(1);
  ComputeAgent agent(io, config);  // outlives the loop: detached steps refer to it
  return run_until_done(io, agent.run());
}

}  // namespace toyvm
