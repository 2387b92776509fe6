#pragma once
#include <string>
#include <string_view>

namespace toyvm {

// A random (version 4) UUID in canonical lower-case form.
std::string new_uuid();

// True for the canonical 8-4-4-4-12 hex form (either case).
bool is_uuid(std::string_view text) noexcept;

}  // namespace toyvm
