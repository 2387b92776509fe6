// toyvm mdserver: the cloud-init metadata service for every host at once. It follows every
// instance in etcd into an in-memory index by guest IP (no etcd round trip per request), so
// it is for guest networks whose addresses are unique across hosts (a routed or provider
// network). Guests on per-host NAT networks share addresses between hosts: there each agent
// serves its own guests ([compute] metadata_interface).

#include "clients/etcd.hpp"
#include "model/keys.hpp"
#include "model/metadata.hpp"
#include "model/records.hpp"
#include "services/common.hpp"
#include "services/metadata_http.hpp"
#include "services/metrics_http.hpp"
#include "services/services.hpp"

#include <boost/asio/signal_set.hpp>
#include <spdlog/spdlog.h>

#include <map>
#include <unordered_map>

namespace toyvm {
namespace {

// What etcd says of every instance, and the guest views built from it, by IP.
class MetadataIndex {
 public:
  MetadataIndex(KeyLayout keys, std::string availability_zone)
      : keys_(std::move(keys)), availability_zone_(std::move(availability_zone)) {}

  void clear() {
    specs_.clear();
    records_.clear();
    views_.clear();
    ip_of_.clear();
  }

  void apply(const KeyValue& kv, bool erased) {
    std::string uuid;
    if (auto work = keys_.parse_work(kv.key)) {
      uuid = work->instance;
      if (erased) {
        specs_.erase(uuid);
      } else if (auto spec = decode_work(kv.value); spec && spec->uuid == uuid) {
        specs_[uuid] = std::move(*spec);
      } else {
        spdlog::warn("ignoring malformed work {}", kv.key);
        return;
      }
    } else if (auto leaf = keys_.leaf(kv.key, keys_.instances_prefix())) {
      uuid = *leaf;
      if (erased) {
        records_.erase(uuid);
      } else if (auto record = decode_instance(kv.value); record && record->uuid == uuid) {
        records_[uuid] = std::move(*record);
      } else {
        spdlog::warn("ignoring malformed instance {}", kv.key);
        return;
      }
    } else {
      return;  // host records
    }
    rebuild(uuid);
  }

  std::shared_ptr<const GuestView> find(const std::string& ip) const {
    auto it = views_.find(ip);
    return it == views_.end() ? nullptr : it->second;
  }

  size_t size() const { return views_.size(); }

 private:
  void rebuild(const std::string& uuid) {
    if (auto old = ip_of_.find(uuid); old != ip_of_.end()) {
      views_.erase(old->second);
      ip_of_.erase(old);
    }
    auto spec = specs_.find(uuid);
    auto record = records_.find(uuid);
    // An ERROR instance gave its guest up: its old address may be another guest's by now.
    if (spec == specs_.end() || record == records_.end() || record->second.ip.empty() ||
        record->second.state == InstanceState::error)
      return;
    if (auto clash = views_.find(record->second.ip); clash != views_.end()) {
      // Two instances claim one address (a stale record): serve neither rather than guess.
      spdlog::warn("instances {} and {} both have IP {}", clash->second->uuid, uuid, record->second.ip);
      ip_of_.erase(clash->second->uuid);
      views_.erase(clash);
      return;
    }
    ip_of_[uuid] = record->second.ip;
    GuestView view = guest_view(spec->second, record->second.ip, availability_zone_);
    view.mac = record->second.mac;  // its DNS is what DHCP tells it
    views_.emplace(record->second.ip, std::make_shared<const GuestView>(std::move(view)));
  }

  KeyLayout keys_;
  std::string availability_zone_;
  std::map<std::string, WorkSpec> specs_;
  std::map<std::string, InstanceRecord> records_;
  std::unordered_map<std::string, std::shared_ptr<const GuestView>> views_;  // by IP
  std::map<std::string, std::string> ip_of_;          // uuid -> IP in views_
};

class MetadataServer {
 public:
  MetadataServer(asio::io_context& io, const Config& config)
      : io_(io),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        index_(keys_, config.mdserver.availability_zone),
        metrics_listen_(config.mdserver.metrics_listen),
        http_(io, config.mdserver, [this](const std::string& ip) { return index_.find(ip); }) {}

  awaitable<Outcome> run(std::vector<std::string> listen) {
    if (auto configured = http_.configure(); !configured) co_return configured.error();
    for (const std::string& address : listen) {
      if (!MetadataHttpServer::parse_listen(address))
        co_return Error(errc::invalid_argument, MetadataHttpServer::bad_listen("listen address", address));
    }
    for (const std::string& address : listen) {
      if (auto served = http_.listen(address, ""); !served) co_return served.error();
    }
    if (!metrics_listen_.empty()) {
      if (auto served = serve_metrics(io_, metrics_listen_, listen); !served) co_return served.error();
    }
    asio::signal_set signals(io_, SIGINT, SIGTERM);
    signals.async_wait([this](const error_code& ec, int) {
      if (!ec) io_.stop();
    });
    co_await follow_etcd();
    co_return ExitCode::ok;
  }

 private:
  // Follows instance records and work (one key range: ".../instances/" sorts right before
  // ".../work/"), not consoles or hosts.
  awaitable<void> follow_etcd() {
    co_await follow_range(
        *etcd_, keys_.instances_prefix(), prefix_range_end(keys_.work_root()),
        [this](const RangeResult& listing) {
          index_.clear();
          for (const KeyValue& kv : listing.kvs) index_.apply(kv, false);
          spdlog::info("indexed {} guests at revision {}", index_.size(), listing.revision);
        },
        [this](const WatchEvent& event) { index_.apply(event.kv, event.type == WatchEvent::Type::erase); },
        [] { return false; });
  }

  asio::io_context& io_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  MetadataIndex index_;
  std::string metrics_listen_;
  MetadataHttpServer http_;
};

}  // namespace

Outcome run_mdserver(const Config& base, const MdserverOptions& options) {
  Config config = base;
  config.etcd.keepalive = true;
  return run_on_loop([&](asio::io_context& io) -> awaitable<Outcome> {
    MetadataServer server(io, config);
    co_return co_await server.run(options.listen.empty() ? config.mdserver.listen : options.listen);
  });
}

}  // namespace toyvm
