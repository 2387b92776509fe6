#include "model/placement_error.hpp"

#include "catch_result.hpp"

using namespace toyvm;

TEST_CASE("generation conflicts are told apart from capacity conflicts") {
  auto concurrent = classify_placement_error(
      409, R"({"errors":[{"status":409,"title":"Conflict","detail":"There was a conflict when trying to complete your request.\n\n resource provider generation conflict","code":"placement.concurrent_update","request_id":"req-1"}]})");
  CHECK(concurrent.code == errc::placement_concurrent_update);
  CHECK(concurrent.detail.find('\n') == std::string::npos);
  auto consumer = classify_placement_error(
      409, R"({"errors":[{"status":409,"detail":"There was a conflict when trying to complete your request.\n\n consumer generation conflict - expected 1 but got 2","code":"placement.concurrent_update"}]})");
  CHECK(consumer.code == errc::placement_consumer_changed);

  auto capacity = classify_placement_error(
      409, R"({"errors":[{"status":409,"title":"Conflict","detail":"Unable to allocate inventory: Unable to create allocation for 'VCPU' on resource provider 'x'. The requested amount would exceed the capacity.","code":"placement.undefined_code"}]})");
  CHECK(capacity.code == errc::placement_capacity);

  auto other = classify_placement_error(
      409, R"({"errors":[{"status":409,"detail":"Conflicting resource provider name: c1 already exists.","code":"placement.duplicate_name"}]})");
  CHECK(other.code == errc::placement_conflict);
}

TEST_CASE("other statuses map to codes, and non-JSON bodies are kept short") {
  CHECK(classify_placement_error(404, R"({"errors":[{"status":404,"detail":"No resource provider"}]})").code ==
        errc::not_found);
  auto server = classify_placement_error(503, std::string(1000, 'x'));
  CHECK(server.code == errc::placement_unavailable);
  CHECK(server.detail.size() == 200);
  auto bad = classify_placement_error(400, R"({"errors":[{"status":400,"detail":"Invalid query string parameters"}]})");
  CHECK(bad.code == errc::invalid_argument);
  CHECK(bad.detail == "Invalid query string parameters");
}

TEST_CASE("a query's trait that Placement has never heard of is named, and only for that refusal") {
  // Placement 8.0's words for GET /allocation_candidates?required=CUSTOM_TOYVM_SHARD_1.
  auto unknown = classify_placement_error(
      400, R"({"errors":[{"status":400,"title":"Bad Request","detail":"The server could not comply with the request since it is either malformed or otherwise incorrect.\n\n No such trait(s): CUSTOM_TOYVM_SHARD_1.  ","code":"placement.undefined_code"}]})");
  CHECK(unknown_trait(unknown) == "CUSTOM_TOYVM_SHARD_1");
  CHECK(unknown_trait(classify_placement_error(400, R"({"errors":[{"status":400,"detail":"Invalid query string parameters"}]})")).empty());
  // The same words in another refusal (a conflict) are no unknown trait of the query's.
  CHECK(unknown_trait(classify_placement_error(409, R"({"errors":[{"status":409,"detail":"No such trait(s): X."}]})")).empty());
}

#include "model/candidates.hpp"

TEST_CASE("allocation candidates parse, and only live hosts are chosen, in Placement's order") {
  const std::string body = R"({
    "allocation_requests": [
      {"allocations": {"aaaaaaaa-0000-4000-8000-000000000001": {"resources": {"VCPU": 1, "MEMORY_MB": 64}}}},
      {"allocations": {"aaaaaaaa-0000-4000-8000-000000000002": {"resources": {"VCPU": 1, "MEMORY_MB": 64}}}},
      {"allocations": {"aaaaaaaa-0000-4000-8000-000000000003": {"resources": {"VCPU": 1}},
                       "bbbbbbbb-0000-4000-8000-000000000009": {"resources": {"DISK_GB": 5}}}}
    ],
    "provider_summaries": {
      "aaaaaaaa-0000-4000-8000-000000000001": {"resources": {"VCPU": {"capacity": 4, "used": 1}}}
    }})";
  auto candidates = parse_allocation_candidates(body);
  REQUIRE(candidates.has_value());
  REQUIRE(candidates->allocation_requests.size() == 3);
  CHECK(candidates->allocation_requests[2].at("bbbbbbbb-0000-4000-8000-000000000009").at("DISK_GB") == 5);
  CHECK(candidates->provider_summaries.at("aaaaaaaa-0000-4000-8000-000000000001").capacity.at("VCPU") == 4);

  std::set<std::string> live{"aaaaaaaa-0000-4000-8000-000000000003", "aaaaaaaa-0000-4000-8000-000000000001"};
  auto choices = rank_candidates(*candidates, live);
  REQUIRE(choices.size() == 2);
  CHECK(choices[0].host == "aaaaaaaa-0000-4000-8000-000000000001");
  CHECK(choices[1].host == "aaaaaaaa-0000-4000-8000-000000000003");
  CHECK(choices[1].allocations->size() == 2);  // the sharing provider's part comes along

  CHECK(rank_candidates(*candidates, {}).empty());
  CHECK_FALSE(parse_allocation_candidates("{}").has_value());
  CHECK_FALSE(parse_allocation_candidates(R"({"allocation_requests":[{"allocations":[]}]})").has_value());
}

namespace {
// Three hosts, the first fullest: h1 has 1 of 8 VCPU free, h2 4, h3 7.
Candidates three_hosts() {
  Candidates c;
  const char* hosts[] = {"h1", "h2", "h3"};
  int64_t used[] = {7, 4, 1};
  for (int i = 0; i < 3; ++i) {
    c.allocation_requests.push_back({{hosts[i], {{"VCPU", 1}}}});
    c.provider_summaries[hosts[i]] = ProviderSummary{{{"VCPU", 8}, {"MEMORY_MB", 1024}}, {{"VCPU", used[i]}, {"MEMORY_MB", 0}}};
  }
  return c;
}
std::vector<std::string> hosts_of(const std::vector<Choice>& choices) {
  std::vector<std::string> out;
  for (auto& c : choices) out.push_back(c.host);
  return out;
}
}  // namespace

TEST_CASE("one provider's room from its capacity and usage is what Placement's search would say of it alone") {
  const ResourceAmounts capacity{{"VCPU", 4}, {"MEMORY_MB", 1024}};
  const ResourceAmounts asked{{"VCPU", 2}, {"MEMORY_MB", 512}};
  auto fits = one_provider_candidates("h1", capacity, {{"VCPU", 2}, {"MEMORY_MB", 512}}, asked);
  CHECK(fits.allocation_requests == std::vector<Allocations>{{{"h1", asked}}});
  CHECK(fits.provider_summaries.at("h1").capacity == capacity);
  CHECK(fits.provider_summaries.at("h1").used == ResourceAmounts{{"VCPU", 2}, {"MEMORY_MB", 512}});
  CHECK(one_provider_candidates("h1", capacity, {}, asked).allocation_requests.size() == 1);  // no usage yet
  CHECK(one_provider_candidates("h1", capacity, {{"VCPU", 3}}, asked).allocation_requests.empty());
  // A class it has no capacity of does not fit.
  CHECK(one_provider_candidates("h1", capacity, {}, {{"DISK_GB", 1}}).allocation_requests.empty());
}

TEST_CASE("spread prefers the emptiest host, pack the fullest") {
  Candidates c = three_hosts();
  std::set<std::string> live{"h1", "h2", "h3"};
  WeighPolicy spread;
  CHECK(hosts_of(rank_candidates(c, live, spread)) == std::vector<std::string>{"h3", "h2", "h1"});
  WeighPolicy pack;
  pack.kind = WeighPolicy::Kind::pack;
  CHECK(hosts_of(rank_candidates(c, live, pack)) == std::vector<std::string>{"h1", "h2", "h3"});
  // A zero multiplier switches a weigher off: equal weights keep Placement's order.
  spread.cpu_multiplier = 0;
  CHECK(hosts_of(rank_candidates(c, live, spread)) == std::vector<std::string>{"h1", "h2", "h3"});
}

TEST_CASE("host_subset_size picks at random among the best hosts only") {
  Candidates c = three_hosts();
  std::set<std::string> live{"h1", "h2", "h3"};
  WeighPolicy spread;
  spread.host_subset_size = 2;
  CHECK(rank_candidates(c, live, spread, 0.0).front().host == "h3");
  CHECK(rank_candidates(c, live, spread, 0.99).front().host == "h2");
  CHECK(rank_candidates(c, live, spread, 0.99).size() == 3);
  spread.host_subset_size = 50;  // larger than the candidates: all of them
  CHECK(rank_candidates(c, live, spread, 0.99).front().host == "h1");
  CHECK(parse_weigh_kind("pack") == WeighPolicy::Kind::pack);
  CHECK_FALSE(parse_weigh_kind("random"));
}
