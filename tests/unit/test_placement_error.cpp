#include "model/placement_error.hpp"

#include "catch_result.hpp"

using namespace toyvm;

TEST_CASE("generation conflicts are told apart from capacity conflicts") {
  auto concurrent = classify_placement_error(
      409, R"({"errors":[{"status":409,"title":"Conflict","detail":"There was a conflict when trying to complete your request.\n\n resource provider generation conflict","code":"placement.concurrent_update","request_id":"req-1"}]})");
  CHECK(concurrent.code == errc::placement_concurrent_update);
  CHECK(concurrent.placement_code == "placement.concurrent_update");
  CHECK(concurrent.detail.find('\n') == std::string::npos);

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
