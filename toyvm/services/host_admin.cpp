// toyvm host disable / enable: take a host out of service and bring it back. The operator's
// intent is a key of its own in etcd, outside any lease; the host's agent follows it (the
// host record says DISABLED, the provider carries COMPUTE_STATUS_DISABLED) and keeps it
// across restarts. Disabling also sets the trait here, for a host whose agent is not
// running; enabling leaves the trait to the agent, the only one that takes it off.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"
#include "services/common.hpp"
#include "services/services.hpp"

#include <algorithm>

namespace toyvm {
namespace {

constexpr const char* disabled_trait = "COMPUTE_STATUS_DISABLED";

class HostAdmin {
 public:
  HostAdmin(asio::io_context& io, const Config& config, const HostOptions& options)
      : options_(options),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        placement_(io.get_executor(), config.placement) {}

  awaitable<int> run() {
    // A name (the agent's --name, Placement's provider name) or the provider's uuid.
    auto named = co_await placement_.provider_named(options_.host);
    if (!named) co_return placement_failure();
    std::string provider = named->value_or("");
    if (provider.empty() && is_uuid(options_.host)) {
      auto traits = co_await placement_.traits(options_.host);
      if (traits) provider = options_.host;
      else if (traits.error() != errc::not_found) co_return placement_failure();
    }
    if (provider.empty())
      co_return report_failure(errc::not_found, fmt::format("no host {} in Placement", options_.host));
    if (options_.disable) co_return co_await disable(provider);
    co_return co_await enable(provider);
  }

 private:
  awaitable<int> disable(const std::string& provider) {
    HostMaintenance maintenance{options_.reason, unix_seconds()};
    auto put = co_await etcd_->put(keys_.disabled(provider), encode(maintenance));
    if (!put) co_return etcd_failure(*etcd_, put.error());
    auto traits = co_await placement_.traits(provider);
    if (!traits) co_return placement_failure();
    if (std::find(traits->begin(), traits->end(), disabled_trait) == traits->end()) {
      traits->push_back(disabled_trait);
      auto set = co_await placement_.set_traits(provider, std::move(*traits));
      if (!set) co_return placement_failure();
    }
    std::printf("DISABLED HOST %s (%s)\n", options_.host.c_str(), provider.c_str());
    co_return 0;
  }

  awaitable<int> enable(const std::string& provider) {
    auto erased = co_await etcd_->erase(keys_.disabled(provider));
    if (!erased) co_return etcd_failure(*etcd_, erased.error());
    auto alive = co_await etcd_->range(keys_.host(provider));
    if (!alive) co_return etcd_failure(*etcd_, alive.error());
    if (alive->kvs.empty())
      std::fprintf(stderr, "toyvm: host %s has no running agent: it takes work once its agent starts\n",
                   options_.host.c_str());
    std::printf("ENABLED HOST %s (%s)\n", options_.host.c_str(), provider.c_str());
    co_return 0;
  }

  int placement_failure() {
    const PlacementError& error = placement_.last_error();
    return report_failure(make_error_code(error.code),
                          fmt::format("Placement at {}: {}", placement_.endpoint(), error.detail));
  }

  const HostOptions& options_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  PlacementClient placement_;
};

}  // namespace

int run_host(const Config& config, const HostOptions& options) {
  return run_on_loop([&](asio::io_context& io) -> awaitable<int> {
    HostAdmin admin(io, config, options);
    co_return co_await admin.run();
  });
}

}  // namespace toyvm
