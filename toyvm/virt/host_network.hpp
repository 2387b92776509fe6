#pragma once
// Host network plumbing for guests, through netlink (no `ip` subprocess).

#include "core/error.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace toyvm {

// Adds ADDRESS/32 to the interface; an address that is already there is success.
result<void> add_interface_address(const std::string& interface, const std::string& ipv4);

// The IPv4 addresses the host's neighbour table holds for `mac` (complete entries of
// /proc/net/arp's text, whose MACs are lower case). Pure.
std::vector<std::string> arp_addresses(std::string_view proc_net_arp, std::string_view mac);

}  // namespace toyvm
