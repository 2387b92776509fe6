// toyvm mdserver: the cloud-init metadata service. It follows every instance in etcd into an
// in-memory index by guest IP (no etcd round trip per request) and answers each guest, found
// by its source address, with its own data only.

#include "clients/etcd.hpp"
#include "model/keys.hpp"
#include "model/metadata.hpp"
#include "model/rate_limit.hpp"
#include "model/records.hpp"
#include "services/common.hpp"
#include "services/services.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/network_v4.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include <map>
#include <unordered_map>

namespace toyvm {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;
constexpr auto no_throw = asio::as_tuple(use_awaitable);

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

  const GuestView* find(const std::string& ip) const {
    auto it = views_.find(ip);
    return it == views_.end() ? nullptr : &it->second;
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
    if (spec == specs_.end() || record == records_.end() || record->second.ip.empty()) return;
    if (auto clash = views_.find(record->second.ip); clash != views_.end()) {
      // Two instances claim one address (a stale record): serve neither rather than guess.
      spdlog::warn("instances {} and {} both have IP {}", clash->second.uuid, uuid, record->second.ip);
      ip_of_.erase(clash->second.uuid);
      views_.erase(clash);
      return;
    }
    GuestView view;
    view.uuid = uuid;
    view.name = spec->second.name;
    view.hostname = hostname_for(spec->second.name, uuid);
    view.ip = record->second.ip;
    view.availability_zone = availability_zone_;
    view.user_data = spec->second.user_data;
    view.public_keys = spec->second.keys;
    ip_of_[uuid] = view.ip;
    views_.emplace(view.ip, std::move(view));
  }

  KeyLayout keys_;
  std::string availability_zone_;
  std::map<std::string, WorkSpec> specs_;
  std::map<std::string, InstanceRecord> records_;
  std::unordered_map<std::string, GuestView> views_;  // by IP
  std::map<std::string, std::string> ip_of_;          // uuid -> IP in views_
};

std::string client_address(const tcp::socket& socket) {
  error_code ec;
  auto endpoint = socket.remote_endpoint(ec);
  if (ec) return {};
  auto address = endpoint.address();
  if (address.is_v6() && address.to_v6().is_v4_mapped())
    return asio::ip::make_address_v4(asio::ip::v4_mapped, address.to_v6()).to_string();
  return address.to_string();
}

class MetadataServer {
 public:
  MetadataServer(asio::io_context& io, const Config& config)
      : io_(io),
        config_(config),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        index_(keys_, config.mdserver.availability_zone),
        limiter_(config.mdserver.rate_limit, config.mdserver.rate_burst) {}

  awaitable<int> run(std::vector<std::string> listen) {
    for (const std::string& cidr : config_.mdserver.guest_networks) {
      error_code ec;
      auto network = asio::ip::make_network_v4(cidr, ec);
      if (ec) co_return report_failure(ExitCode::usage, fmt::format("bad guest network '{}' (expected A.B.C.D/N)", cidr));
      guest_networks_.push_back(network);
    }
    for (const std::string& address : listen) {
      auto acceptor = open_acceptor(address);
      if (!acceptor) co_return static_cast<int>(ExitCode::usage);
      asio::co_spawn(io_, accept_loop(std::move(acceptor)), asio::detached);
    }
    asio::signal_set signals(io_, SIGINT, SIGTERM);
    signals.async_wait([this](const error_code& ec, int) {
      if (!ec) io_.stop();
    });
    co_await follow_etcd();
    co_return 0;
  }

 private:
  std::unique_ptr<tcp::acceptor> open_acceptor(const std::string& address) {
    size_t colon = address.rfind(':');
    error_code ec;
    auto ip = asio::ip::make_address(address.substr(0, colon), ec);
    unsigned long port = colon == std::string::npos ? 0 : std::strtoul(address.c_str() + colon + 1, nullptr, 10);
    if (ec || port == 0 || port > 65535) {
      report_failure(ExitCode::usage, fmt::format("bad listen address '{}' (expected ADDRESS:PORT)", address));
      return nullptr;
    }
    auto acceptor = std::make_unique<tcp::acceptor>(io_);
    tcp::endpoint endpoint(ip, static_cast<unsigned short>(port));
    acceptor->open(endpoint.protocol(), ec);
    if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor->bind(endpoint, ec);
    if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      report_failure(ExitCode::failed, fmt::format("cannot listen on {}: {}", address, ec.message()));
      return nullptr;
    }
    spdlog::info("serving metadata on {}", address);
    return acceptor;
  }

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

  awaitable<void> accept_loop(std::unique_ptr<tcp::acceptor> acceptor) {
    while (true) {
      auto [ec, socket] = co_await acceptor->async_accept(no_throw);
      if (ec) {
        if (ec == asio::error::operation_aborted) co_return;
        // Out of descriptors and the like: pause rather than spin.
        asio::steady_timer timer(io_, 10ms);
        co_await timer.async_wait(use_awaitable);
        continue;
      }
      if (connections_ >= config_.mdserver.max_connections) continue;  // closes it
      asio::co_spawn(io_, serve(std::move(socket)), asio::detached);
    }
  }

  awaitable<void> serve(tcp::socket socket) {
    ++connections_;
    struct Count {
      int& n;
      ~Count() { --n; }
    } count{connections_};
    const std::string ip = client_address(socket);
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    const auto idle = std::chrono::milliseconds(int64_t(config_.mdserver.idle_timeout_s * 1000));
    while (true) {
      stream.expires_after(idle);  // also bounds a client that sends a request slowly
      http::request_parser<http::empty_body> parser;
      parser.header_limit(8 * 1024);
      auto [read_ec, read] = co_await http::async_read(stream, buffer, parser, no_throw);
      if (read_ec) {
        if (read_ec == http::error::header_limit) co_await reply_error(stream, http::status::request_header_fields_too_large);
        else if (read_ec == http::error::unexpected_body || read_ec == http::error::body_limit)
          co_await reply_error(stream, http::status::payload_too_large);
        else if (read_ec != http::error::end_of_stream && read_ec != beast::error::timeout &&
                 read_ec != asio::error::connection_reset && read_ec != asio::error::eof)
          co_await reply_error(stream, http::status::bad_request);
        break;
      }
      const auto& request = parser.get();
      MetadataResponse answer;
      if (!from_guest_network(ip)) {
        answer = {403, "text/plain", "Forbidden\n"};
      } else if (!limiter_.allow(ip, std::chrono::steady_clock::now())) {
        answer = {429, "text/plain", "Too Many Requests\n"};
      } else {
        answer = route_metadata(request.method_string(), request.target(), index_.find(ip));
      }
      http::response<http::string_body> response{static_cast<http::status>(answer.status), request.version()};
      response.set(http::field::server, "toyvm-mdserver");
      response.set(http::field::content_type, answer.content_type);
      response.keep_alive(request.keep_alive());
      response.body() = std::move(answer.body);
      response.prepare_payload();
      if (request.method() == http::verb::head) response.body().clear();  // length stays
      auto [write_ec, written] = co_await http::async_write(stream, response, no_throw);
      if (write_ec || !response.keep_alive()) break;
    }
    error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  }

  bool from_guest_network(const std::string& ip) const {
    if (guest_networks_.empty()) return true;
    error_code ec;
    auto address = asio::ip::make_address_v4(ip, ec);
    if (ec) return false;
    for (const auto& network : guest_networks_) {
      if ((address.to_uint() & network.netmask().to_uint()) == network.network().to_uint()) return true;
    }
    return false;
  }

  static awaitable<void> reply_error(beast::tcp_stream& stream, http::status status) {
    http::response<http::string_body> response{status, 11};
    response.set(http::field::server, "toyvm-mdserver");
    response.keep_alive(false);
    response.body() = std::string(http::obsolete_reason(status)) + "\n";
    response.prepare_payload();
    co_await http::async_write(stream, response, no_throw);
  }

  asio::io_context& io_;
  const Config& config_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  MetadataIndex index_;
  RateLimiter limiter_;
  std::vector<asio::ip::network_v4> guest_networks_;
  int connections_ = 0;
};

}  // namespace

int run_mdserver(const Config& base, const MdserverOptions& options) {
  Config config = base;
  config.etcd.keepalive = true;
  return run_on_loop([&](asio::io_context& io) -> awaitable<int> {
    MetadataServer server(io, config);
    co_return co_await server.run(options.listen.empty() ? config.mdserver.listen : options.listen);
  });
}

}  // namespace toyvm
