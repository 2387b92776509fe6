#pragma once
// The OpenStack Placement API as toyvm uses it, and a thin client for it.

#include "clients/http.hpp"
#include "core/config.hpp"
#include "model/candidates.hpp"
#include "model/inventory.hpp"
#include "model/placement_error.hpp"
#include "model/projects.hpp"
#include "model/query.hpp"

#include <algorithm>
#include <map>
#include <set>
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
  ConsumerOwner owner;                // as read, for a consumer Placement knows: a write that names
                                      // another owner gives the consumer to it
};

// Placement as the services use it: the HTTP client below, or an in-memory one in unit tests.
class Placement {
 public:
  virtual ~Placement() = default;

  // GET /allocation_candidates?<query>, within `timeout` (none: [placement] timeout)
  virtual awaitable<result<Candidates>> allocation_candidates(std::string query, Duration timeout) = 0;
  // PUT /allocations/{consumer} for a new consumer (consumer_generation null) of `owner`.
  virtual awaitable<result<void>> claim(std::string consumer, Allocations allocations, ConsumerOwner owner) = 0;
  // POST /allocations for new consumers of `owner`: all of them or none, in one request under
  // each provider's generation (Placement retries its own generation conflicts).
  virtual awaitable<result<void>> claim_all(std::vector<std::pair<std::string, Allocations>> consumers,
                                            ConsumerOwner owner) = 0;
  // POST /allocations: every consumer's allocations replaced at once, or none if any
  // consumer's generation moved (placement_consumer_changed) or a provider lacks room. Nova's
  // move: the instance's share of the source handed to a migration consumer, and back.
  virtual awaitable<result<void>> write_together(std::vector<ConsumerWrite> writes) = 0;
  // PUT /allocations/{consumer} for one that holds allocations: replaces them all in one
  // step (a move to another provider) unless the consumer changed since `generation`
  // (placement_concurrent_update). `owner` as read: the consumer stays its owner's.
  virtual awaitable<result<void>> replace(std::string consumer, Allocations allocations, int64_t generation,
                                          ConsumerOwner owner) = 0;
  // GET /allocations/{consumer}, with the consumer's generation.
  virtual awaitable<result<ConsumerAllocations>> consumer_allocations(std::string consumer) = 0;
  // DELETE /allocations/{consumer}; releasing what is already gone succeeds.
  virtual awaitable<result<void>> release(std::string consumer) = 0;
  virtual awaitable<result<Allocations>> allocations_of(std::string consumer) = 0;
  virtual awaitable<result<ResourceAmounts>> usages(std::string provider) = 0;
  // GET /usages?project_id=&consumer_type=all: what a project's consumers hold (its moves'
  // migration consumers are in a project of their own), and how many hold anything.
  virtual awaitable<result<ProjectUsage>> project_usage(std::string project_id) = 0;
  // The uuid of the provider named `name`, if there is one.
  virtual awaitable<result<std::optional<std::string>>> provider_named(std::string name) = 0;
  // The uuids of the providers that carry `trait`, and what each consumer holds of one
  // provider (consumer -> amounts).
  virtual awaitable<result<std::vector<std::string>>> providers(std::string trait) = 0;
  virtual awaitable<result<std::map<std::string, ResourceAmounts>>> provider_allocations(std::string provider) = 0;
  virtual awaitable<result<Inventory>> inventory(std::string provider) = 0;
  virtual awaitable<result<std::vector<std::string>>> traits(std::string provider) = 0;

  // Creates the provider if it does not exist (idempotent); `surely_new`: created without
  // looking first (a uuid just made).
  virtual awaitable<result<void>> ensure_provider(std::string uuid, std::string name, bool surely_new = false) = 0;
  // Replaces the provider's inventory, retrying on generation conflicts.
  virtual awaitable<result<void>> set_inventory(std::string uuid, Inventory inventory) = 0;
  // The traits Placement knows whose names start with `prefix`.
  virtual awaitable<result<std::vector<std::string>>> known_traits(std::string prefix) = 0;
  // Sets the provider's aggregates to exactly these uuids.
  virtual awaitable<result<void>> set_aggregates(std::string uuid, std::vector<std::string> aggregates) = 0;
  // Creates custom traits as needed and sets the provider's traits to exactly these.
  virtual awaitable<result<void>> set_traits(std::string uuid, std::vector<std::string> traits) = 0;
  // Adds one standard trait and leaves the others as they are when it is written: the list
  // and its generation are read together and written back under that generation.
  virtual awaitable<result<void>> add_trait(std::string uuid, std::string trait) = 0;

  // A connection opened ahead of the next request (see HttpClient::preconnect).
  virtual awaitable<void> preconnect() = 0;
};

// The Placement API over HTTP. Every call pins its own microversion.
class PlacementClient final : public Placement {
 public:
  PlacementClient(asio::any_io_executor executor, const PlacementConfig& config);

  awaitable<result<Candidates>> allocation_candidates(std::string query, Duration timeout) override;
  awaitable<result<void>> claim(std::string consumer, Allocations allocations, ConsumerOwner owner) override;
  awaitable<result<void>> claim_all(std::vector<std::pair<std::string, Allocations>> consumers,
                                    ConsumerOwner owner) override;
  awaitable<result<void>> write_together(std::vector<ConsumerWrite> writes) override;
  awaitable<result<void>> replace(std::string consumer, Allocations allocations, int64_t generation,
                                  ConsumerOwner owner) override;
  awaitable<result<ConsumerAllocations>> consumer_allocations(std::string consumer) override;
  awaitable<result<void>> release(std::string consumer) override;
  awaitable<result<Allocations>> allocations_of(std::string consumer) override;
  awaitable<result<ResourceAmounts>> usages(std::string provider) override;
  awaitable<result<ProjectUsage>> project_usage(std::string project_id) override;
  awaitable<result<std::optional<std::string>>> provider_named(std::string name) override;
  awaitable<result<std::vector<std::string>>> providers(std::string trait) override;
  awaitable<result<std::map<std::string, ResourceAmounts>>> provider_allocations(std::string provider) override;
  awaitable<result<Inventory>> inventory(std::string provider) override;
  awaitable<result<std::vector<std::string>>> traits(std::string provider) override;
  awaitable<result<void>> ensure_provider(std::string uuid, std::string name, bool surely_new = false) override;
  awaitable<result<void>> set_inventory(std::string uuid, Inventory inventory) override;
  awaitable<result<std::vector<std::string>>> known_traits(std::string prefix) override;
  awaitable<result<void>> set_aggregates(std::string uuid, std::vector<std::string> aggregates) override;
  awaitable<result<void>> set_traits(std::string uuid, std::vector<std::string> traits) override;
  awaitable<result<void>> add_trait(std::string uuid, std::string trait) override;
  awaitable<void> preconnect() override { return http_.preconnect(); }

  const std::string& endpoint() const { return http_.url(); }
  // Placement takes its time over many consumers in one POST: 200 ms each, at least the usual
  // (8 batches of 250 at once took over 50 ms each on two cores at 10,000 hosts).
  Duration batch_timeout(size_t consumers) const {
    return std::max(config_.timeout, std::chrono::milliseconds(200 * int64_t(consumers)));
  }

 private:
  awaitable<result<void>> put_allocations(std::string consumer, Allocations allocations,
                                         std::optional<int64_t> generation, ConsumerOwner owner);
  awaitable<result<HttpResponse>> call(std::string method, std::string target, std::string microversion,
                                       std::string body = {}, std::chrono::milliseconds timeout = {});
  // After a consumer's generation conflict on a new consumer: whether it holds exactly `asked`,
  // which (its uuid being fresh) means that an earlier try of this very request was made (a
  // request sent again after its answer was lost). Holding anything else, it is not this
  // request's: an earlier try of the same caller with another plan may have landed after all.
  awaitable<bool> claimed_before(const std::string& consumer, const Allocations& asked);
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
  // A provider's generation as this client last saw it: a write tries it first and reads the
  // provider again only when refused (someone else changed it). Registering a host takes five
  // requests, not ten.
  std::map<std::string, int64_t> generations_;
  std::set<std::string> custom_traits_;  // made by this client: not asked for again
};

}  // namespace toyvm
