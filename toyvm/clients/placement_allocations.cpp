// Placement's allocations: claims, moves between consumers, releases (microversion 1.39).

#include "clients/placement.hpp"

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace toyvm {
namespace {

namespace json = boost::json;

constexpr const char* mv_allocations = "1.39";  // consumer_type is required from 1.38

json::object amounts_json(const ResourceAmounts& amounts) {
  json::object out;
  for (auto& [rc, n] : amounts) out[rc] = n;
  return out;
}

json::object allocations_json(const Allocations& allocations, std::optional<int64_t> generation,
                              ConsumerType type, const ConsumerOwner& owner) {
  json::object body;
  json::object by_provider;
  for (auto& [rp, resources] : allocations)
    by_provider[rp] = json::object{{"resources", amounts_json(resources)}};
  body["allocations"] = std::move(by_provider);
  // Placement requires both ids; the project's marks the consumer as this toyvm's.
  body["project_id"] = owner.project;
  body["user_id"] = owner.user;
  if (generation) {
    body["consumer_generation"] = *generation;
  } else {
    body["consumer_generation"] = nullptr;
  }
  body["consumer_type"] = type == ConsumerType::migration ? "MIGRATION" : "INSTANCE";
  return body;
}

// A query parameter's value, percent-encoded but for RFC 3986's unreserved characters.
std::string query_value(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += char(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

}  // namespace

awaitable<result<void>> PlacementClient::claim(std::string consumer, Allocations allocations, ConsumerOwner owner) {
  co_return co_await put_allocations(std::move(consumer), std::move(allocations), std::nullopt, std::move(owner));
}

awaitable<result<void>> PlacementClient::replace(std::string consumer, Allocations allocations, int64_t generation,
                                                 ConsumerOwner owner) {
  co_return co_await put_allocations(std::move(consumer), std::move(allocations), generation, std::move(owner));
}

awaitable<result<ConsumerAllocations>> PlacementClient::consumer_allocations(std::string consumer) {
  auto response = co_await call("GET", "/allocations/" + consumer, mv_allocations);
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  co_return parse_consumer_allocations(response->body);
}

awaitable<result<void>> PlacementClient::claim_all(std::vector<std::pair<std::string, Allocations>> consumers,
                                                   ConsumerOwner owner) {
  json::object body;
  for (auto& [consumer, allocations] : consumers)
    body[consumer] = allocations_json(allocations, std::nullopt, ConsumerType::instance, owner);
  const auto timeout = batch_timeout(consumers.size());
  auto response = co_await call("POST", "/allocations", mv_allocations, json::serialize(body), timeout);
  if (!response) co_return response.error();
  if (response->status == 204) co_return result<void>{};
  Error refusal = refused(*response);
  if (refusal != errc::placement_consumer_changed) co_return refusal;
  // Every consumer, not the first: each must hold what this request asks for it.
  for (const auto& [consumer, allocations] : consumers) {
    const bool same = co_await claimed_before(consumer, allocations);
    if (!same) co_return refusal;
  }
  co_return result<void>{};
}

awaitable<bool> PlacementClient::claimed_before(const std::string& consumer, const Allocations& asked) {
  auto held = co_await consumer_allocations(consumer);
  co_return held && held->allocations == asked;
}

awaitable<result<void>> PlacementClient::put_allocations(std::string consumer, Allocations allocations,
                                                         std::optional<int64_t> generation, ConsumerOwner owner) {
  json::object body = allocations_json(allocations, generation, ConsumerType::instance, owner);
  auto response = co_await call("PUT", "/allocations/" + consumer, mv_allocations,
                                json::serialize(body));
  if (!response) co_return response.error();
  if (response->status == 204) co_return result<void>{};
  Error refusal = refused(*response);
  if (refusal != errc::placement_consumer_changed || generation) co_return refusal;
  const bool same = co_await claimed_before(consumer, allocations);
  if (same) co_return result<void>{};
  co_return refusal;
}

awaitable<result<void>> PlacementClient::release(std::string consumer) {
  auto response = co_await call("DELETE", "/allocations/" + consumer, mv_allocations);
  if (!response) co_return response.error();
  if (response->status != 204 && response->status != 404) co_return refused(*response);
  co_return result<void>{};
}

awaitable<result<ProjectUsage>> PlacementClient::project_usage(std::string project_id) {
  auto response = co_await call("GET", "/usages?project_id=" + query_value(project_id) + "&consumer_type=all",
                                mv_allocations);
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  co_return parse_project_usage(response->body);
}

awaitable<result<Allocations>> PlacementClient::allocations_of(std::string consumer) {
  auto response = co_await call("GET", "/allocations/" + consumer, mv_allocations);
  if (!response) co_return response.error();
  if (response->status != 200) co_return refused(*response);
  co_return parse_allocations(response->body);
}

awaitable<result<void>> PlacementClient::write_together(std::vector<ConsumerWrite> writes) {
  json::object body;
  for (const ConsumerWrite& write : writes)
    body[write.consumer] = allocations_json(write.allocations, write.generation, write.type, write.owner);
  const auto timeout = batch_timeout(writes.size());
  auto response = co_await call("POST", "/allocations", mv_allocations, json::serialize(body), timeout);
  if (!response) co_return response.error();
  if (response->status == 204) co_return result<void>{};
  co_return refused(*response);
}

}  // namespace toyvm
