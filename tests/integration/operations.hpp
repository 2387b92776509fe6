#pragma once
// What the tests of operating toyvm share: flavors, and readers of host figures, records and
// `show`'s JSON.

#include "harness.hpp"
#include "model/keys.hpp"
#include "model/moves.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"

#include "catch_result.hpp"

#include <boost/json/parse.hpp>
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace toyvm::test {

namespace json = boost::json;
namespace fs = std::filesystem;

inline const std::string small = "resources=VCPU:1,MEMORY_MB:64";
inline const std::string roomy = "VCPU:1000,DISK_GB:10000,MEMORY_MB:100000";

inline std::optional<HostStats> host_stats(const Servers& servers, const std::string& rp) {
  auto kvs = servers.etcd_prefix(KeyLayout().stats(rp));
  if (kvs.empty()) return std::nullopt;
  auto stats = decode_host_stats(kvs.front().value);
  return stats ? std::optional<HostStats>(*stats) : std::nullopt;
}

inline std::optional<InstanceState> record_of_state(const Servers& servers, const std::string& uuid) {
  auto kvs = servers.etcd_prefix(KeyLayout().instance(uuid));
  if (kvs.empty()) return std::nullopt;
  auto record = decode_instance(kvs.front().value);
  return record ? std::optional<InstanceState>(record->state) : std::nullopt;
}

inline bool has_status(const Servers& servers, const std::string& rp, const std::string& status) {
  auto record = host_record(servers, rp);
  return record && record->status == status;
}

inline bool provider_disabled(const Servers& servers, const std::string& rp) {
  auto traits = run_sync<std::vector<std::string>>([&](asio::io_context& io) -> awaitable<std::vector<std::string>> {
    PlacementClient placement(io.get_executor(), servers.config.placement);
    auto t = co_await placement.traits(rp);
    co_return t ? *t : std::vector<std::string>{};
  });
  return std::find(traits.begin(), traits.end(), "COMPUTE_STATUS_DISABLED") != traits.end();
}

// The host's object in `show --hosts --json`.
inline json::object shown_host(const Servers& servers, const std::string& rp) {
  auto shown = servers.toyvm({"show", "--hosts", "--json"});
  REQUIRE(shown.exit_code == 0);
  json::value hosts = json::parse(shown.out);
  for (const json::value& host : hosts.as_array())
    if (host.at("provider").as_string() == rp) return host.as_object();
  FAIL("host " << rp << " is not in show --hosts");
  return {};
}

}  // namespace toyvm::test
