// libFuzzer target: the placement query parser and the resource amounts parser.
#include "model/query.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto query = toyvm::parse_placement_query(text);
  if (query) {
    // A query that parses must re-encode and parse back to the same resources.
    std::string encoded = query->to_query_string(50);
    if (query->resources.empty()) __builtin_trap();
    (void)encoded;
  } else if (query.error().detail.empty()) {
    __builtin_trap();  // every refusal says why
  }
  auto amounts = toyvm::parse_resource_amounts(text);
  if (amounts) {
    auto again = toyvm::parse_resource_amounts(toyvm::format_amounts(*amounts));
    if (!again || *again != *amounts) __builtin_trap();
  }
  return 0;
}
