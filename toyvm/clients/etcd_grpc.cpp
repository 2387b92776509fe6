// The gRPC plumbing under the etcd client: status codes as toyvm's errors, the one
// completion queue of the process, and the channel to etcd's members (addresses, TLS,
// keepalive) made from the configuration.

#include "clients/etcd_grpc.hpp"

#include "core/address.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

namespace toyvm::etcd_grpc {
namespace {

// "http://127.0.0.1:2379,http://127.0.0.1:22379" -> "ipv4:127.0.0.1:2379,127.0.0.1:22379": one
// channel over every member; pick_first moves to the next address when one fails.
bool uses_tls(const EtcdConfig& config) {
  return std::any_of(config.endpoints.begin(), config.endpoints.end(),
                     [](const std::string& endpoint) { return endpoint.starts_with("https://"); });
}

std::string read_text_file(const std::string& path) {
  if (path.empty()) return {};
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

HostPort split_endpoint(const std::string& endpoint) { return split_host_port(endpoint, "2379"); }

// gRPC's dns:/// target takes one name, its ipv4: and ipv6: targets a list of addresses: the
// members' names are resolved here, once, so that pick_first fails over between all of them
// (IPv4 addresses when there are any, as one target takes one family). Each process starts at a
// member of its own, at random: were every agent of a cloud to reach the first member first,
// that member would carry all their watches and lease keep-alives, the others nothing.
std::string grpc_target(const std::vector<std::string>& endpoints) {
  std::vector<std::string> v4, v6;
  for (const std::string& endpoint : endpoints) {
    HostPort at = split_endpoint(endpoint);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(at.host.c_str(), at.port.c_str(), &hints, &found) != 0) continue;
    for (addrinfo* a = found; a; a = a->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      if (a->ai_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof text);
        v4.push_back(fmt::format("{}:{}", text, at.port));
      } else if (a->ai_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text, sizeof text);
        v6.push_back(fmt::format("[{}]:{}", text, at.port));
      }
    }
    freeaddrinfo(found);
  }
  static const size_t first_member = std::random_device{}();
  for (auto* list : {&v4, &v6}) {
    std::sort(list->begin(), list->end());
    list->erase(std::unique(list->begin(), list->end()), list->end());
    if (!list->empty()) std::rotate(list->begin(), list->begin() + long(first_member % list->size()), list->end());
  }
  if (!v4.empty()) return "ipv4:" + fmt::format("{}", fmt::join(v4, ","));
  if (!v6.empty()) return "ipv6:" + fmt::format("{}", fmt::join(v6, ","));
  // Nothing resolves now: gRPC resolves the member itself, and again as it reconnects.
  HostPort first = split_endpoint(endpoints[first_member % endpoints.size()]);
  return fmt::format("dns:///{}:{}", first.host, first.port);
}

}  // namespace

Error from_status(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK: return {};
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED: return Error(errc::etcd_unavailable, status.error_message());
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      // "too many requests": its applies far behind its commits, which passes as a timeout
      // does. A database over its quota ("database space exceeded") does not.
      if (status.error_message().find("too many requests") != std::string::npos)
        return Error(errc::etcd_unavailable, status.error_message());
      return Error(errc::etcd_error, status.error_message());
    case grpc::StatusCode::CANCELLED: return Error(errc::cancelled, status.error_message());
    case grpc::StatusCode::PERMISSION_DENIED: return Error(errc::permission_denied, status.error_message());
    default: return Error(errc::etcd_error, status.error_message());
  }
}

std::string status_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "ok";
    case grpc::StatusCode::UNAVAILABLE: return "unavailable";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "deadline_exceeded";
    case grpc::StatusCode::CANCELLED: return "cancelled";
    case grpc::StatusCode::UNAUTHENTICATED: return "unauthenticated";
    case grpc::StatusCode::PERMISSION_DENIED: return "permission_denied";
    default: return "error";
  }
}

KeyValue from_pb(const mvccpb::KeyValue& kv) {
  return {kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease()};
}

grpc::CompletionQueue* completion_queue() {
  // Never shut down, like the channels: operations may be pending while the process exits.
  static grpc::CompletionQueue* queue = [] {
    auto* queue = new grpc::CompletionQueue;
    std::thread([queue] {
      void* tag = nullptr;
      bool ok = false;
      while (queue->Next(&tag, &ok)) {
        std::unique_ptr<Completion> completion(static_cast<Completion*>(tag));
        completion->run(ok);
      }
    }).detach();
    return queue;
  }();
  return queue;
}

std::shared_ptr<grpc::Channel> make_channel(const EtcdConfig& config) {
  grpc::ChannelArguments args;
  args.SetLoadBalancingPolicyName("pick_first");
  args.SetMaxReceiveMessageSize(256 << 20);
  if (config.keepalive) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, int(std::chrono::milliseconds(etcd_ping_interval).count()));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, int(std::chrono::milliseconds(etcd_ping_timeout).count()));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  }
  // toyvm retries every step itself. gRPC 1.51's own retry layer aborts the process on a
  // call that ends without a grpc-status (etcd over TLS answers so while it shuts down;
  // grpc/grpc#34683); without that layer such a call fails like any other.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2'000);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (uses_tls(config)) {
    // The files were checked when the configuration was loaded.
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = read_text_file(config.ca_file);  // empty: gRPC's default roots
    tls.pem_cert_chain = read_text_file(config.cert_file);
    tls.pem_private_key = read_text_file(config.key_file);
    credentials = grpc::SslCredentials(tls);
    // The members are dialled by address: their certificates are checked against the
    // configured name, else the first member's name.
    std::string name = config.server_name;
    if (name.empty()) {
      HostPort first = split_endpoint(config.endpoints.front());
      if (!is_ip_address(first.host)) name = first.host;
    }
    if (!name.empty()) args.SetSslTargetNameOverride(name);
  }
  return grpc::CreateCustomChannel(grpc_target(config.endpoints), credentials, args);
}

}  // namespace toyvm::etcd_grpc
