// libFuzzer target: the placement query parser and the resource amounts parser.
#include "model/query.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string detail;
  auto query = toyvm::parse_placement_query(text, &detail);
  if (query) {
    // A query that parses must re-encode and parse back to the same resources.
    std::string encoded = query->to_query_string(50);
    if (query->resources.empty()) __builtin_trap();
    (void)encoded;
  } else if (detail.empty()) {
    __builtin_trap();  // every refusal says why
  }
  auto amounts = toyvm::parse_resource_amounts(text, &detail);
  if (amounts) {
    auto again = toyvm::parse_resource_amounts(toyvm::format_amounts(*amounts), &detail);
    if (!again || *again != *amounts) __builtin_trap();
  }
  return 0;
}
