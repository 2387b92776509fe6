#pragma once
// Placement in memory, for unit tests of the services (as FakeEtcd and FakeVirt are): providers
// with inventory, traits and aggregates, consumers with allocations under generations, and
// Placement's refusals (a consumer's generation moved, capacity). Candidates are single
// providers with room for the query's resources, its required and forbidden traits and its
// member_of, in the tree in_tree names. `down` makes every call fail as an unreachable
// Placement.

#include "clients/placement.hpp"
#include "model/query.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace toyvm::fakes {

class MemoryPlacement final : public Placement {
 public:
  struct Provider {
    std::string name;
    Inventory inventory;
    std::set<std::string> traits;
    std::vector<std::string> aggregates;
  };
  struct Consumer {
    Allocations allocations;
    int64_t generation = 0;
    ConsumerType type = ConsumerType::instance;
    ConsumerOwner owner{};
  };
  std::map<std::string, Provider> providers_by_uuid;
  std::map<std::string, Consumer> consumers;
  bool down = false;
  int calls = 0;
  std::vector<std::string> queries;        // of allocation_candidates, as asked
  std::vector<std::string> usages_asked;   // providers whose usages were asked for
  std::map<std::string, int> releases;     // consumer -> times released

  // A provider with room for `amounts` (totals, nothing reserved).
  void add_provider(const std::string& uuid, const std::string& name, const ResourceAmounts& amounts) {
    providers_by_uuid[uuid] = Provider{name, inventory_from_amounts(amounts), {}, {}};
  }

  // The one provider a consumer holds allocations on; empty when it holds none.
  std::string held_on(const std::string& consumer) const {
    auto found = consumers.find(consumer);
    return found == consumers.end() || found->second.allocations.empty() ? "" : found->second.allocations.begin()->first;
  }

  ResourceAmounts used_on(const std::string& provider) const {
    ResourceAmounts used;
    for (const auto& [uuid, consumer] : consumers)
      if (auto held = consumer.allocations.find(provider); held != consumer.allocations.end())
        for (const auto& [rc, amount] : held->second) used[rc] += amount;
    return used;
  }

  awaitable<result<Candidates>> allocation_candidates(std::string query, Duration) override {
    if (auto e = unreachable()) co_return *e;
    queries.push_back(query);
    auto parsed = parse_placement_query(query);
    if (!parsed) co_return parsed.error();
    std::set<std::string> required, forbidden, member_of;
    std::string in_tree;
    for (const auto& [key, value] : parsed->params) {
      if (key == "in_tree") in_tree = value;
      for (const std::string& item : split(value.starts_with("in:") ? value.substr(3) : value)) {
        if (key == "required") (item.starts_with("!") ? forbidden : required).insert(item.substr(item[0] == '!'));
        if (key == "member_of") member_of.insert(item);
      }
    }
    // Placement knows a custom trait once it is made (a provider's traits made it here).
    for (const std::string& trait : required) {
      const bool known = std::any_of(providers_by_uuid.begin(), providers_by_uuid.end(),
                                     [&](const auto& provider) { return provider.second.traits.count(trait) > 0; });
      if (trait.starts_with("CUSTOM_") && !known)
        co_return Error(errc::invalid_argument, "Placement: No such trait(s): " + trait + ".");
    }
    Candidates out;
    for (const auto& [uuid, p] : providers_by_uuid) {
      if (!in_tree.empty() && uuid != in_tree) continue;
      if (!fits(uuid, parsed->resources, {})) continue;
      if (!std::includes(p.traits.begin(), p.traits.end(), required.begin(), required.end())) continue;
      if (std::any_of(forbidden.begin(), forbidden.end(), [&](auto& t) { return p.traits.count(t) > 0; })) continue;
      if (!member_of.empty() && std::none_of(p.aggregates.begin(), p.aggregates.end(),
                                             [&](auto& a) { return member_of.count(a) > 0; }))
        continue;
      out.allocation_requests.push_back({{uuid, parsed->resources}});
      out.provider_summaries[uuid] = ProviderSummary{capacity_of(p.inventory), used_on(uuid)};
    }
    co_return out;
  }

  awaitable<result<void>> claim(std::string consumer, Allocations allocations, ConsumerOwner owner) override {
    std::vector<ConsumerWrite> writes(1, ConsumerWrite{consumer, std::move(allocations), std::nullopt,
                                                       ConsumerType::instance, std::move(owner)});
    co_return co_await write_together(std::move(writes));
  }

  awaitable<result<void>> claim_all(std::vector<std::pair<std::string, Allocations>> claims,
                                    ConsumerOwner owner) override {
    std::vector<ConsumerWrite> writes;
    for (auto& [consumer, allocations] : claims)
      writes.push_back({consumer, std::move(allocations), std::nullopt, ConsumerType::instance, owner});
    co_return co_await write_together(std::move(writes));
  }

  awaitable<result<void>> write_together(std::vector<ConsumerWrite> writes) override {
    if (auto e = unreachable()) co_return *e;
    std::set<std::string> rewritten;
    for (const ConsumerWrite& w : writes) {
      auto found = consumers.find(w.consumer);
      std::optional<int64_t> now;
      if (found != consumers.end()) now = found->second.generation;
      if (now != w.generation)
        co_return Error(errc::placement_consumer_changed, fmt::format("consumer {} generation conflict", w.consumer));
      rewritten.insert(w.consumer);
    }
    for (const ConsumerWrite& w : writes)
      for (const auto& [provider, amounts] : w.allocations)
        if (!fits(provider, amounts, rewritten, writes))
          co_return Error(errc::placement_capacity, fmt::format("would exceed the capacity of {}", provider));
    for (ConsumerWrite& w : writes) {
      if (w.allocations.empty()) {
        consumers.erase(w.consumer);
        continue;
      }
      Consumer& c = consumers[w.consumer];
      c.allocations = std::move(w.allocations);
      c.type = w.type;
      c.owner = std::move(w.owner);
      ++c.generation;
    }
    co_return result<void>{};
  }

  awaitable<result<void>> replace(std::string consumer, Allocations allocations, int64_t generation,
                                  ConsumerOwner owner) override {
    std::vector<ConsumerWrite> writes(1, ConsumerWrite{consumer, std::move(allocations), generation,
                                                       ConsumerType::instance, std::move(owner)});
    co_return co_await write_together(std::move(writes));
  }

  awaitable<result<ConsumerAllocations>> consumer_allocations(std::string consumer) override {
    if (auto e = unreachable()) co_return *e;
    ConsumerAllocations out;
    if (auto found = consumers.find(consumer); found != consumers.end()) {
      out.allocations = found->second.allocations;
      out.generation = found->second.generation;
      out.owner = found->second.owner;
    }
    co_return out;
  }

  awaitable<result<void>> release(std::string consumer) override {
    if (auto e = unreachable()) co_return *e;
    consumers.erase(consumer);
    ++releases[consumer];
    co_return result<void>{};
  }

  awaitable<result<Allocations>> allocations_of(std::string consumer) override {
    auto held = co_await consumer_allocations(consumer);
    if (!held) co_return held.error();
    co_return held->allocations;
  }

  awaitable<result<ResourceAmounts>> usages(std::string provider) override {
    if (auto e = unreachable()) co_return *e;
    usages_asked.push_back(provider);
    co_return used_on(provider);
  }

  awaitable<result<ProjectUsage>> project_usage(std::string project_id) override {
    if (auto e = unreachable()) co_return *e;
    ProjectUsage out;
    for (const auto& [uuid, c] : consumers) {
      if (c.owner.project != project_id || c.allocations.empty()) continue;
      ++out.instances;
      for (const auto& [provider, amounts] : c.allocations)
        for (const auto& [rc, amount] : amounts) out.amounts[rc] += amount;
    }
    co_return out;
  }

  awaitable<result<std::optional<std::string>>> provider_named(std::string name) override {
    if (auto e = unreachable()) co_return *e;
    for (const auto& [uuid, p] : providers_by_uuid)
      if (p.name == name) co_return std::optional<std::string>(uuid);
    co_return std::optional<std::string>();
  }

  awaitable<result<std::vector<std::string>>> providers(std::string trait) override {
    if (auto e = unreachable()) co_return *e;
    std::vector<std::string> out;
    for (const auto& [uuid, p] : providers_by_uuid)
      if (p.traits.count(trait)) out.push_back(uuid);
    co_return out;
  }

  awaitable<result<std::map<std::string, ResourceAmounts>>> provider_allocations(std::string provider) override {
    if (auto e = unreachable()) co_return *e;
    std::map<std::string, ResourceAmounts> out;
    for (const auto& [uuid, consumer] : consumers)
      if (auto held = consumer.allocations.find(provider); held != consumer.allocations.end()) out[uuid] = held->second;
    co_return out;
  }

  awaitable<result<Inventory>> inventory(std::string provider) override {
    if (auto e = unreachable()) co_return *e;
    auto p = find_provider(provider);
    if (!p) co_return p.error();
    co_return (*p)->inventory;
  }

  awaitable<result<std::vector<std::string>>> traits(std::string provider) override {
    if (auto e = unreachable()) co_return *e;
    auto p = find_provider(provider);
    if (!p) co_return p.error();
    co_return std::vector<std::string>((*p)->traits.begin(), (*p)->traits.end());
  }

  awaitable<result<void>> ensure_provider(std::string uuid, std::string name, bool = false) override {
    if (auto e = unreachable()) co_return *e;
    providers_by_uuid.try_emplace(uuid, Provider{name, {}, {}, {}});
    co_return result<void>{};
  }

  awaitable<result<void>> set_inventory(std::string uuid, Inventory inventory) override {
    if (auto e = unreachable()) co_return *e;
    auto p = find_provider(uuid);
    if (!p) co_return p.error();
    (*p)->inventory = std::move(inventory);
    co_return result<void>{};
  }

  awaitable<result<std::vector<std::string>>> known_traits(std::string prefix) override {
    if (auto e = unreachable()) co_return *e;
    std::set<std::string> all;
    for (const auto& [uuid, p] : providers_by_uuid)
      for (const std::string& t : p.traits)
        if (t.starts_with(prefix)) all.insert(t);
    co_return std::vector<std::string>(all.begin(), all.end());
  }

  awaitable<result<void>> set_aggregates(std::string uuid, std::vector<std::string> aggregates) override {
    if (auto e = unreachable()) co_return *e;
    auto p = find_provider(uuid);
    if (!p) co_return p.error();
    (*p)->aggregates = std::move(aggregates);
    co_return result<void>{};
  }

  awaitable<result<void>> set_traits(std::string uuid, std::vector<std::string> traits) override {
    if (auto e = unreachable()) co_return *e;
    auto p = find_provider(uuid);
    if (!p) co_return p.error();
    (*p)->traits = {traits.begin(), traits.end()};
    co_return result<void>{};
  }

  awaitable<result<void>> add_trait(std::string uuid, std::string trait) override {
    if (auto e = unreachable()) co_return *e;
    auto p = find_provider(uuid);
    if (!p) co_return p.error();
    (*p)->traits.insert(trait);
    co_return result<void>{};
  }

  awaitable<void> preconnect() override { co_return; }

 private:
  std::optional<Error> unreachable() {
    ++calls;
    if (!down) return std::nullopt;
    return Error(errc::placement_unavailable, "Placement (in memory) is down");
  }

  result<Provider*> find_provider(const std::string& uuid) {
    auto found = providers_by_uuid.find(uuid);
    if (found == providers_by_uuid.end()) return Error(errc::not_found, fmt::format("no resource provider {}", uuid));
    return &found->second;
  }

  static std::vector<std::string> split(const std::string& list) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1)
      out.push_back(list.substr(start, comma - start));
    out.push_back(list.substr(start));
    return out;
  }

  // Whether `provider` has room for `amounts` besides what others hold: the consumers being
  // rewritten count with their new allocations (`writes`), not their old ones.
  bool fits(const std::string& provider, const ResourceAmounts& amounts, const std::set<std::string>& rewritten,
            const std::vector<ConsumerWrite>& writes = {}) const {
    auto p = providers_by_uuid.find(provider);
    if (p == providers_by_uuid.end()) return false;
    ResourceAmounts used;
    for (const auto& [uuid, consumer] : consumers) {
      if (rewritten.count(uuid)) continue;
      if (auto held = consumer.allocations.find(provider); held != consumer.allocations.end())
        for (const auto& [rc, amount] : held->second) used[rc] += amount;
    }
    // The other writes' shares of this provider, then this one's own.
    ResourceAmounts asked;
    for (const ConsumerWrite& w : writes)
      if (auto on = w.allocations.find(provider); on != w.allocations.end())
        for (const auto& [rc, amount] : on->second) asked[rc] += amount;
    if (writes.empty()) asked = amounts;
    for (const auto& [rc, amount] : asked) {
      auto item = p->second.inventory.find(rc);
      if (item == p->second.inventory.end() || used[rc] + amount > item->second.capacity()) return false;
    }
    return true;
  }
};

}  // namespace toyvm::fakes
