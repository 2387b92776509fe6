#pragma once
// A thin client for the OpenStack Placement API. Every call pins its own microversion.

#include "clients/http.hpp"
#include "core/config.hpp"
#include "model/candidates.hpp"
#include "model/inventory.hpp"
#include "model/placement_error.hpp"
#include "model/query.hpp"

#include <map>
#include <string>
#include <vector>

namespace toyvm {

enum class ConsumerType { instance, migration };

// One consumer's part of a write that changes several at once.
struct ConsumerWrite {
  std::string consumer;
  Allocations allocations;            // empty: it gives up all it holds
  std::optional<int64_t> generation;  // the consumer's, as read; none for a consumer new to Placement
  ConsumerType type = ConsumerType::instance;
};

class PlacementClient {
 public:
  PlacementClient(asio::any_io_executor executor, const PlacementConfig& config);

  // GET /allocation_candidates?<query>
  awaitable<result<Candidates>> allocation_candidates(std::string query);
  // PUT /allocations/{consumer} for a new consumer (consumer_generation null).
  awaitable<result<void>> claim(std::string consumer, Allocations allocations);
  // POST /allocations for new consumers: all of them or none, in one request under each
  // provider's generation (Placement retries its own generation conflicts).
  awaitable<result<void>> claim_all(std::vector<std::pair<std::string, Allocations>> consumers);
  // POST /allocations: every consumer's allocations replaced at once, or none if any
  // consumer's generation moved (placement_consumer_changed) or a provider lacks room. Nova's
  // move: the instance's share of the source handed to a migration consumer, and back.
  awaitable<result<void>> write_together(std::vector<ConsumerWrite> writes);
  // PUT /allocations/{consumer} for one that holds allocations: replaces them all in one
  // step (a move to another provider) unless the consumer changed since `generation`
  // (placement_concurrent_update).
  awaitable<result<void>> replace(std::string consumer, Allocations allocations, int64_t generation);
  // GET /allocations/{consumer}, with the consumer's generation.
  awaitable<result<ConsumerAllocations>> consumer_allocations(std::string consumer);
  // DELETE /allocations/{consumer}; releasing what is already gone succeeds.
  awaitable<result<void>> release(std::string consumer);
  awaitable<result<Allocations>> allocations_of(std::string consumer);
  awaitable<result<ResourceAmounts>> usages(std::string provider);
  // The uuid of the provider named `name`, if there is one.
  awaitable<result<std::optional<std::string>>> provider_named(std::string name);
  // The uuids of the providers that carry `trait`, and what each consumer holds of one
  // provider (consumer -> amounts).
  awaitable<result<std::vector<std::string>>> providers(std::string trait);
  awaitable<result<std::map<std::string, ResourceAmounts>>> provider_allocations(std::string provider);
  awaitable<result<Inventory>> inventory(std::string provider);
  awaitable<result<std::vector<std::string>>> traits(std::string provider);

  // Creates the provider if it does not exist (idempotent).
  awaitable<result<void>> ensure_provider(std::string uuid, std::string name);
  // Replaces the provider's inventory, retrying on generation conflicts.
  awaitable<result<void>> set_inventory(std::string uuid, Inventory inventory);
  // The traits Placement knows whose names start with `prefix`.
  awaitable<result<std::vector<std::string>>> known_traits(std::string prefix);
  // Sets the provider's aggregates to exactly these uuids.
  awaitable<result<void>> set_aggregates(std::string uuid, std::vector<std::string> aggregates);
  // Creates custom traits as needed and sets the provider's traits to exactly these.
  awaitable<result<void>> set_traits(std::string uuid, std::vector<std::string> traits);
  // Adds one standard trait and leaves the others as they are when it is written: the list
  // and its generation are read together and written back under that generation.
  awaitable<result<void>> add_trait(std::string uuid, std::string trait);

  const std::string& endpoint() const { return http_.url(); }
  // A connection opened ahead of the next request (see HttpClient::preconnect).
  awaitable<void> preconnect() { return http_.preconnect(); }

 private:
  awaitable<result<void>> put_allocations(std::string consumer, Allocations allocations,
                                         std::optional<int64_t> generation);
  awaitable<result<HttpResponse>> call(std::string method, std::string target, std::string microversion,
                                       std::string body = {}, std::chrono::milliseconds timeout = {});
  // After a consumer's generation conflict on new consumers: whether the first holds allocations already, which
  // (their uuids being fresh) means that an earlier try of this very request was made.
  awaitable<bool> claimed_before(const std::string& consumer);
  awaitable<result<int64_t>> provider_generation(const std::string& uuid);
  // What Placement said when it refused a request, classified; its words after its address.
  Error refused(const HttpResponse& response) const;
  awaitable<result<void>> put_with_generation(std::string uuid, std::string what, std::string microversion,
                                              std::string value_json);

  // Keystone: a project-scoped token for X-Auth-Token, fetched when missing.
  awaitable<result<void>> authenticate();
  // One request, retried on 5xx and refused connections.
  awaitable<result<HttpResponse>> send(const HttpRequest& request);

  HttpClient http_;
  PlacementConfig config_;
  std::unique_ptr<HttpClient> keystone_;  // with auth_url only
  std::string token_;
};

}  // namespace toyvm
