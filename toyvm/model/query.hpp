#pragma once
// The placement query a user gives `toyvm schedule`: the query string of
// GET /allocation_candidates, e.g. `resources=VCPU:1,MEMORY_MB:256&required=HW_CPU_X86_AVX2`.

#include "core/error.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toyvm {

using ResourceAmounts = std::map<std::string, int64_t>;  // resource class -> amount

struct PlacementQuery {
  // Every parameter in the order given, passed through to Placement unchanged.
  std::vector<std::pair<std::string, std::string>> params;
  // The sum of every request group's resources (what the instance will consume).
  ResourceAmounts resources;
  int limit = 0;  // 0: not given

  // The query string for GET /allocation_candidates, with `limit` set to `default_limit`
  // unless the user gave one.
  std::string to_query_string(int default_limit) const;
};

// Validates syntax locally so that a typo is reported in one clear line instead of a
// Placement 400; the detail names the offending part.
result<PlacementQuery> parse_placement_query(std::string_view text);

// "VCPU:4,DISK_GB:10,MEMORY_MB:512" (the value of `resources=`; also `--inventory`).
result<ResourceAmounts> parse_resource_amounts(std::string_view text);

// "MEMORY_MB:256,VCPU:1": the same form parse_resource_amounts reads.
std::string format_amounts(const ResourceAmounts& amounts);

bool is_resource_class(std::string_view name) noexcept;
bool is_trait_name(std::string_view name) noexcept;

}  // namespace toyvm
