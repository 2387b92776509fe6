#include "model/query.hpp"

#include "catch_result.hpp"

using namespace toyvm;

TEST_CASE("the toy's query parses into resources and parameters") {
  auto q = parse_placement_query("resources=VCPU:1,DISK_GB:1,MEMORY_MB:256&required=HW_CPU_X86_AVX2");
  REQUIRE(q);
  CHECK(q->resources == ResourceAmounts{{"VCPU", 1}, {"DISK_GB", 1}, {"MEMORY_MB", 256}});
  CHECK(q->params.size() == 2);
  CHECK(q->to_query_string(50) ==
        "resources=VCPU:1,DISK_GB:1,MEMORY_MB:256&required=HW_CPU_X86_AVX2&limit=50");
}

TEST_CASE("granular groups sum into the instance's resources and pass through") {
  auto q = parse_placement_query(
      "resources1=VCPU:2&resources2=VCPU:1,MEMORY_MB:64&group_policy=isolate&required1=!CUSTOM_X"
      "&member_of=in:4d0e0f4a-3c3b-4b8e-9a8e-3a6b3e0c1f2d&limit=3");
  REQUIRE(q);
  CHECK(q->resources == ResourceAmounts{{"VCPU", 3}, {"MEMORY_MB", 64}});
  CHECK(q->limit == 3);
  CHECK(q->to_query_string(50).find("limit=50") == std::string::npos);
}

TEST_CASE("values are percent-encoded when they need it") {
  auto q = parse_placement_query("resources=VCPU:1&in_tree=a b");
  REQUIRE(q);
  CHECK(q->to_query_string(0) == "resources=VCPU:1&in_tree=a%20b");
}

TEST_CASE("malformed queries are refused with a detail that names the problem") {
  struct Case {
    const char* query;
    const char* mentions;
  };
  const Case cases[] = {
      {"", "empty query"},
      {"resources=", "empty resource list"},
      {"resources=VCPU", "bad resource 'VCPU'"},
      {"resources=VCPU:0", "bad resource 'VCPU:0'"},
      {"resources=VCPU:-1", "bad resource"},
      {"resources=vcpu:1", "bad resource 'vcpu:1'"},
      {"resources=VCPU:1,VCPU:2", "given twice"},
      {"resources=VCPU:1&bogus=1", "unknown parameter 'bogus'"},
      {"resources=VCPU:1&required=lower", "bad trait 'lower'"},
      {"resources=VCPU:1&limit=x", "bad limit"},
      {"required=HW_CPU_X86_AVX2", "names no resources"},
      {"resources=VCPU:1&&", "bad parameter"},
      {"resources=VCPU:99999999999999999999", "bad resource"},
  };
  for (const Case& c : cases) {
    INFO(c.query);
      auto q = parse_placement_query(c.query);
    REQUIRE_FALSE(q);
    CHECK(q.error() == errc::invalid_argument);
    CHECK_THAT(said(q), Catch::Contains(c.mentions));
  }
}

TEST_CASE("resource amounts format back into the form they are parsed from") {
  auto amounts = parse_resource_amounts("VCPU:4,DISK_GB:10,MEMORY_MB:512");
  REQUIRE(amounts);
  CHECK(format_amounts(*amounts) == "DISK_GB:10,MEMORY_MB:512,VCPU:4");
  CHECK(parse_resource_amounts(format_amounts(*amounts)).value() == *amounts);
}
