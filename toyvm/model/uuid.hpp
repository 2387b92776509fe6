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

// Shards of a large cloud ([placement] shards): each host has the trait of the shard its
// provider uuid falls in, and a schedule asks Placement about one shard first (a bounded,
// well-spread subset), the whole cloud only when that one has no room. The same on every host
// and scheduler without a lookup: a hash of the uuid. A trait, not an aggregate: it is set with
// the host's other traits, one write to Placement fewer for each host that registers.
int shard_of(std::string_view provider, int shards);
std::string shard_trait(int shard);
bool is_shard_trait(std::string_view trait);

// The uuid of the `index`th instance a project's request makes (model/requests.hpp): the same
// for every try of it, so a scheduler service that takes over a request another left half
// done finds that one's claims under the same consumers.
std::string request_instance_uuid(std::string_view request_id, int index);

// True for the canonical 8-4-4-4-12 hex form (either case).
bool is_uuid(std::string_view text) noexcept;

}  // namespace toyvm
