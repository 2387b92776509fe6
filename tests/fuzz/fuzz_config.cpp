// libFuzzer target: configuration loading (TOML).
#include "core/config.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = toyvm::parse_config(text);
  if (!config && config.error().detail.empty()) __builtin_trap();  // every refusal says why
  return 0;
}
