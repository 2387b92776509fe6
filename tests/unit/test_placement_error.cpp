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
