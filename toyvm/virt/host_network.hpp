#pragma once
// Host network plumbing for guests, through netlink (no `ip` subprocess).

#include "core/error.hpp"

#include <string>

namespace toyvm {

// Adds ADDRESS/32 to the interface; an address that is already there is success.
result<void> add_interface_address(const std::string& interface, const std::string& ipv4);

}  // namespace toyvm
