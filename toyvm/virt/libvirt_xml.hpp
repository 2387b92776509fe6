#pragma once
// The XML the libvirt backend writes for its storage: the instance pool and each instance's
// disk overlay (domain_xml, in virt/backend.hpp, writes the domain).

#include "virt/backend.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace toyvm {

std::string xml_escape(std::string_view text);

// A dir pool named `name` over `dir`.
std::string storage_pool_xml(const std::string& name, const std::string& dir);

// The instance's copy-on-write qcow2 of `capacity` bytes over `image`'s disk, or a blank one
// when the image has none.
std::string overlay_volume_xml(const std::string& uuid, uint64_t capacity, const BootImage& image);

// The overlay's volume name in the pool.
std::string overlay_name(const std::string& uuid);

// The agent named in a domain's toyvm metadata element, as virDomainGetMetadata gives it;
// nothing when it is not such an element.
std::optional<std::string> owner_in_metadata(std::string_view element);

}  // namespace toyvm
