#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace toyvm {

// A random (version 4) UUID in canonical lower-case form.
std::string new_uuid();

// 64 random bits from the kernel, to seed a generator.
uint64_t random_seed();

// The Placement aggregate that stands for an availability zone: a name-based (version 5)
// UUID, so every host and scheduler derives the same one without a lookup.
std::string availability_zone_aggregate(std::string_view zone);

// True for the canonical 8-4-4-4-12 hex form (either case).
bool is_uuid(std::string_view text) noexcept;

}  // namespace toyvm
