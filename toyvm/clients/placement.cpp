#include "clients/placement.hpp"

#include "core/backoff.hpp"
#include "core/metrics.hpp"

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <boost/url/url.hpp>
#include <fmt/format.h>
#include <simdjson.h>
#include <spdlog/spdlog.h>

namespace toyvm {
namespace {

namespace json = boost::json;

// The microversions toyvm speaks: 1.39 for candidates (every query parameter up to
// `required=in:`) and claims (clients/placement_allocations.cpp); 1.26 for inventory
// (reserved may equal total); 1.20 for POST /resource_providers (answers with the body).
constexpr const char* mv_candidates = "1.39";
constexpr const char* mv_providers = "1.20";
constexpr const char* mv_inventory = "1.26";
// 1.23 at least wherever a generation can conflict: errors carry their code (e.g.
// placement.concurrent_update, which is retried) only from 1.23 on.
constexpr const char* mv_traits = "1.23";
constexpr const char* mv_aggregates = "1.23";  // aggregates with the provider generation (1.19)

// {"traits": ["HW_CPU_X86_AVX2", ...]}
result<std::vector<std::string>> parse_traits(const std::string& body) {
  simdjson::dom::parser parser;
  simdjson::dom::array traits;
  if (parser.parse(body)["traits"].get_array().get(traits)) return Error(errc::placement_error, "malformed traits");
  std::vector<std::string> out;
  for (auto trait : traits) {
    std::string_view name;
    if (!trait.get_string().get(name)) out.emplace_back(name);
  }
  return out;
}

}  // namespace

PlacementClient::PlacementClient(asio::any_io_executor executor, const PlacementConfig& config)
    : http_(executor, HttpClientOptions{config.endpoint, config.timeout,
                                        std::chrono::milliseconds(20'000), config.ca_file}),
      config_(config) {
  if (!config.auth_url.empty())
    keystone_ = std::make_unique<HttpClient>(
        executor, HttpClientOptions{config.auth_url, config.timeout,
                                    std::chrono::milliseconds(20'000), config.ca_file});
}

awaitable<result<void>> PlacementClient::authenticate() {
  json::object user{{"name", config_.user},
                    {"domain", json::object{{"name", config_.user_domain}}},
                    {"password", config_.password}};
  json::object project{{"name", config_.project}, {"domain", json::object{{"name", config_.project_domain}}}};
  json::object auth{{"identity", json::object{{"methods", json::array{"password"}},
                                              {"password", json::object{{"user", std::move(user)}}}}},
                    {"scope", json::object{{"project", std::move(project)}}}};
  HttpRequest request{"POST", "/auth/tokens", {}, json::serialize(json::object{{"auth", std::move(auth)}})};
  auto response = co_await keystone_->request(std::move(request));
  if (!response)
    co_return Error(errc::placement_unavailable,
                    fmt::format("cannot reach Keystone at {}: {}", keystone_->url(), response.error().message()));
  if (response->status != 201 || response->subject_token.empty())
    co_return Error(errc::placement_error, fmt::format("Keystone at {} refused user {} (HTTP {})", keystone_->url(),
                                                       config_.user, response->status));
  token_ = std::move(response->subject_token);
  co_return result<void>{};
}

awaitable<result<HttpResponse>> PlacementClient::call(std::string method, std::string target, std::string microversion,
                                                      std::string body, std::chrono::milliseconds timeout) {
  HttpRequest request;
  request.method = std::move(method);
  request.target = std::move(target);
  request.timeout = timeout;
  request.headers.emplace_back("OpenStack-API-Version", "placement " + microversion);
  request.body = std::move(body);
  // With Keystone, a token that expired (401) is replaced once and the request sent again.
  for (int renewals = 0;; ++renewals) {
    if (keystone_ && token_.empty()) {
      if (auto authenticated = co_await authenticate(); !authenticated) co_return authenticated.error();
    }
    const std::string& token = keystone_ ? token_ : config_.token;
    request.headers.resize(1);
    if (!token.empty()) request.headers.emplace_back(config_.token_header, token);
    auto response = co_await send(request);
    if (keystone_ && renewals == 0 && response && response->status == 401) {
      spdlog::info("Placement refused the Keystone token (expired?); fetching a new one");
      token_.clear();
      continue;
    }
    co_return response;
  }
}

awaitable<result<HttpResponse>> PlacementClient::send(const HttpRequest& request) {
  // sqlite-backed Placement answers 500 "database is locked" under concurrent writers, and a
  // restarting Placement refuses connections: a few quick retries ride over both, which carried
  // nothing out.
  Backoff backoff(std::chrono::milliseconds(50), std::chrono::milliseconds(400));
  const auto started = std::chrono::steady_clock::now();
  for (int attempt = 1;; ++attempt) {
    auto response = co_await http_.request(request);
    // Not one that timed out: Placement may carry it out yet (a claim), and its caller decides.
    bool retry = attempt < 4 && (response ? response->status >= 500 : !timed_out(response.error()));
    if (!retry) {
      metrics::observe("toyvm_placement_request_seconds",
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      metrics::count("toyvm_placement_requests_total",
                     {{"method", request.method}, {"code", response ? std::to_string(response->status) : "unavailable"}});
      if (!response)
        co_return Error(errc::placement_unavailable,
                        fmt::format("cannot reach Placement at {}: {}", http_.url(), response.error().message()));
      co_return response;
    }
    spdlog::debug("placement {} {}: {}, retrying", request.method, request.target,
                  response ? fmt::format("HTTP {}", response->status) : response.error().message());
    co_await backoff.wait();
  }
}

Error PlacementClient::refused(const HttpResponse& response) const {
  Error said = classify_placement_error(response.status, response.body);
  said.detail = fmt::format("Placement at {}: {}", http_.url(), said.message());
  return said;
}

awaitable<result<Candidates>> PlacementClient::allocation_candidates(std::string query, Duration timeout) {
  auto response = co_await call("GET", "/allocation_candidates?" + query, mv_candidates, {}, timeout);
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  auto parsed = parse_allocation_candidates(response->body);
  if (!parsed) co_return Error(errc::placement_error, "malformed allocation candidates");
  co_return parsed;
}

awaitable<result<std::optional<std::string>>> PlacementClient::provider_named(std::string name) {
  boost::urls::url query("/resource_providers");
  query.params().append({"name", name});
  auto response = co_await call("GET", std::string(query.buffer()), mv_providers);
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  auto uuids = parse_provider_uuids(response->body);
  if (!uuids) co_return uuids.error();
  if (uuids->empty()) co_return std::optional<std::string>();
  co_return std::optional<std::string>(uuids->front());
}

awaitable<result<std::vector<std::string>>> PlacementClient::providers(std::string trait) {
  auto response = co_await call("GET", "/resource_providers?required=" + trait, mv_providers);  // 1.18+
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  co_return parse_provider_uuids(response->body);
}

awaitable<result<std::map<std::string, ResourceAmounts>>> PlacementClient::provider_allocations(std::string provider) {
  auto response = co_await call("GET", "/resource_providers/" + provider + "/allocations", mv_providers);
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  co_return parse_allocations(response->body);  // the same shape, keyed by consumer
}

awaitable<result<ResourceAmounts>> PlacementClient::usages(std::string provider) {
  auto response = co_await call("GET", "/resource_providers/" + provider + "/usages", mv_inventory);
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  co_return parse_usages(response->body);
}

awaitable<result<Inventory>> PlacementClient::inventory(std::string provider) {
  auto response = co_await call("GET", "/resource_providers/" + provider + "/inventories", mv_inventory);
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  simdjson::dom::parser parser;
  simdjson::dom::object inventories;
  if (parser.parse(response->body)["inventories"].get_object().get(inventories))
    co_return Error(errc::placement_error, "malformed inventories");
  Inventory out;
  for (auto [rc, entry] : inventories) {
    InventoryItem item;
    if (entry["total"].get_int64().get(item.total) || entry["reserved"].get_int64().get(item.reserved) ||
        entry["min_unit"].get_int64().get(item.min_unit) || entry["max_unit"].get_int64().get(item.max_unit) ||
        entry["step_size"].get_int64().get(item.step_size) ||
        entry["allocation_ratio"].get_double().get(item.allocation_ratio))
      co_return Error(errc::placement_error, "malformed inventories");
    out[std::string(rc)] = item;
  }
  co_return out;
}

awaitable<result<std::vector<std::string>>> PlacementClient::traits(std::string provider) {
  auto response = co_await call("GET", "/resource_providers/" + provider + "/traits", mv_traits);
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  co_return parse_traits(response->body);
}

awaitable<result<std::vector<std::string>>> PlacementClient::known_traits(std::string prefix) {
  auto response = co_await call("GET", "/traits?name=startswith:" + prefix, mv_traits);
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  co_return parse_traits(response->body);
}

awaitable<result<int64_t>> PlacementClient::provider_generation(const std::string& uuid) {
  auto response = co_await call("GET", "/resource_providers/" + uuid, mv_providers);
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  simdjson::dom::parser parser;
  int64_t generation = 0;
  if (parser.parse(response->body)["generation"].get_int64().get(generation))
    co_return Error(errc::placement_error, "malformed resource provider");
  generations_[uuid] = generation;
  co_return generation;
}

awaitable<result<void>> PlacementClient::ensure_provider(std::string uuid, std::string name, bool surely_new) {
  if (!surely_new) {
    auto existing = co_await provider_generation(uuid);
    if (existing) co_return result<void>{};
    if (existing.error() != errc::not_found) co_return existing.error();
  }
  json::object body{{"uuid", uuid}, {"name", name}};
  auto response = co_await call("POST", "/resource_providers", mv_providers, json::serialize(body));
  if (!response) co_return response.error();
  if (response->status == 200 || response->status == 201) {
    generations_[uuid] = 0;  // a new provider's
    co_return result<void>{};
  }
  // Another start of this same agent may have created it meanwhile.
  if (response->status == 409 && (co_await provider_generation(uuid))) co_return result<void>{};
  co_return refused(*response);
}

// PUT /resource_providers/{uuid}/{what} with {"resource_provider_generation": G, what: value}:
// a generation conflict re-reads the generation and tries again.
awaitable<result<void>> PlacementClient::put_with_generation(std::string uuid, std::string what,
                                                             std::string microversion, std::string value_json) {
  for (int attempt = 0; attempt < 10; ++attempt) {
    result<int64_t> generation = Error(errc::not_found);
    if (auto seen = generations_.find(uuid); seen != generations_.end()) generation = seen->second;
    else generation = co_await provider_generation(uuid);
    if (!generation) co_return generation.error();
    std::string body = fmt::format(R"({{"resource_provider_generation":{},"{}":{}}})", *generation, what, value_json);
    auto response = co_await call("PUT", "/resource_providers/" + uuid + "/" + what, microversion, std::move(body));
    if (!response) co_return response.error();
    if (response->status == 200) {
      // The answer carries the provider's new generation (inventories, traits, aggregates).
      simdjson::dom::parser parser;
      int64_t next = 0;
      if (!parser.parse(response->body)["resource_provider_generation"].get_int64().get(next)) generations_[uuid] = next;
      else generations_.erase(uuid);
      co_return result<void>{};
    }
    generations_.erase(uuid);  // read again before the next try
    if (Error refusal = refused(*response); refusal != errc::placement_concurrent_update) co_return refusal;
  }
  co_return Error(errc::placement_concurrent_update, "the provider kept changing meanwhile");
}

awaitable<result<void>> PlacementClient::set_inventory(std::string uuid, Inventory inventory) {
  json::object inventories;
  for (auto& [rc, item] : inventory) {
    inventories[rc] = json::object{{"total", item.total},       {"reserved", item.reserved},
                                   {"min_unit", item.min_unit}, {"max_unit", item.max_unit},
                                   {"step_size", item.step_size},
                                   {"allocation_ratio", item.allocation_ratio}};
  }
  co_return co_await put_with_generation(std::move(uuid), "inventories", mv_inventory, json::serialize(inventories));
}

awaitable<result<void>> PlacementClient::set_aggregates(std::string uuid, std::vector<std::string> aggregates) {
  json::array list;
  for (const std::string& aggregate : aggregates) list.emplace_back(aggregate);
  co_return co_await put_with_generation(std::move(uuid), "aggregates", mv_aggregates, json::serialize(list));
}

awaitable<result<void>> PlacementClient::add_trait(std::string uuid, std::string trait) {
  for (int attempt = 0; attempt < 10; ++attempt) {
    auto response = co_await call("GET", "/resource_providers/" + uuid + "/traits", mv_traits);
    if (!response) co_return response.error();
    if (response->status != 200) co_return refused(*response);
    auto traits = parse_traits(response->body);
    int64_t generation = 0;
    simdjson::dom::parser parser;
    if (!traits || parser.parse(response->body)["resource_provider_generation"].get_int64().get(generation))
      co_return Error(errc::placement_error, "malformed traits");
    if (std::find(traits->begin(), traits->end(), trait) != traits->end()) co_return result<void>{};
    json::array names;
    for (const std::string& name : *traits) names.emplace_back(name);
    names.emplace_back(trait);
    json::object body{{"resource_provider_generation", generation}, {"traits", std::move(names)}};
    auto put = co_await call("PUT", "/resource_providers/" + uuid + "/traits", mv_traits, json::serialize(body));
    if (!put) co_return put.error();
    if (put->status == 200) co_return result<void>{};
    if (Error refusal = refused(*put); refusal != errc::placement_concurrent_update) co_return refusal;
  }
  co_return Error(errc::placement_concurrent_update, "the provider kept changing meanwhile");
}

awaitable<result<void>> PlacementClient::set_traits(std::string uuid, std::vector<std::string> traits) {
  json::array names;
  for (const std::string& trait : traits) {
    if (trait.starts_with("CUSTOM_") && !custom_traits_.count(trait)) {
      auto created = co_await call("PUT", "/traits/" + trait, mv_traits);
      if (!created) co_return created.error();
      if (created->status != 201 && created->status != 204) co_return refused(*created);
      custom_traits_.insert(trait);
    }
    names.emplace_back(trait);
  }
  co_return co_await put_with_generation(std::move(uuid), "traits", mv_traits, json::serialize(names));
}

}  // namespace toyvm
