#include "model/uuid.hpp"

#include <boost/uuid/name_generator_sha1.hpp>
#include <boost/uuid/string_generator.hpp>
#include <boost/uuid/uuid.hpp>
#include <boost/uuid/uuid_io.hpp>

#include <sys/random.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace toyvm {

namespace {

// From the kernel's generator, as uuid_generate does: every random bit of a UUID is random
// (a generator seeded with 64 bits gives two processes with one seed the same UUIDs), and
// nothing probes the CPU for a hardware source at start-up, as std::random_device does.
void fill_random(void* out, size_t size) {
  auto* bytes = static_cast<uint8_t*>(out);
  while (size > 0) {
    ssize_t got = getrandom(bytes, size, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      std::abort();  // without flags it waits for the kernel's seeding; it fails only where it does not exist
    }
    bytes += got;
    size -= size_t(got);
  }
}

}  // namespace

uint64_t random_seed() {
  uint64_t seed = 0;
  fill_random(&seed, sizeof seed);
  return seed;
}

std::string new_uuid() {
  boost::uuids::uuid id;
  fill_random(id.data, sizeof id.data);
  id.data[6] = uint8_t((id.data[6] & 0x0f) | 0x40);  // version 4
  id.data[8] = uint8_t((id.data[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return boost::uuids::to_string(id);
}

std::string availability_zone_aggregate(std::string_view zone) {
  // toyvm's namespace for zone names (itself a random UUID, fixed forever).
  static const boost::uuids::uuid ns = boost::uuids::string_generator()("6f3c2b1e-8a4d-4c55-9a1e-2f7b9d0c4e11");
  boost::uuids::name_generator_sha1 generate(ns);
  return boost::uuids::to_string(generate(zone.data(), zone.size()));
}

int shard_of(std::string_view provider, int shards) {
  if (shards <= 1) return 0;
  uint64_t hash = 14695981039346656037ull;  // FNV-1a: stable across builds and machines
  for (const char c : provider) hash = (hash ^ uint8_t(c)) * 1099511628211ull;
  return int(hash % uint64_t(shards));
}

constexpr std::string_view shard_trait_prefix = "CUSTOM_TOYVM_SHARD_";

std::string shard_trait(int shard) { return std::string(shard_trait_prefix) + std::to_string(shard); }

bool is_shard_trait(std::string_view trait) { return trait.starts_with(shard_trait_prefix); }

std::string request_instance_uuid(std::string_view request_id, int index) {
  // toyvm's namespace for the instances of project requests (a random UUID, fixed forever).
  static const boost::uuids::uuid ns = boost::uuids::string_generator()("0b8e4f7a-3c21-4d6e-9f50-7a1c2e3d4b59");
  boost::uuids::name_generator_sha1 generate(ns);
  const std::string name = std::string(request_id) + "/" + std::to_string(index);
  return boost::uuids::to_string(generate(name.data(), name.size()));
}

bool is_uuid(std::string_view text) noexcept {
  if (text.size() != 36) return false;
  for (size_t i = 0; i < text.size(); ++i) {
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? text[i] != '-' : !std::isxdigit(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

}  // namespace toyvm
