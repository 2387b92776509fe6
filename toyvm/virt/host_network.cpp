#include "virt/host_network.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace toyvm {
namespace {

void add_attribute(nlmsghdr* message, int type, const void* data, size_t length) {
  auto* attribute = reinterpret_cast<rtattr*>(reinterpret_cast<char*>(message) + NLMSG_ALIGN(message->nlmsg_len));
  attribute->rta_type = static_cast<unsigned short>(type);
  attribute->rta_len = static_cast<unsigned short>(RTA_LENGTH(length));
  std::memcpy(RTA_DATA(attribute), data, length);
  message->nlmsg_len = NLMSG_ALIGN(message->nlmsg_len) + RTA_ALIGN(attribute->rta_len);
}

}  // namespace

std::vector<std::string> arp_addresses(std::string_view table, std::string_view mac) {
  std::vector<std::string> found;
  size_t at = table.find('\n');  // past the heading
  while (at != std::string_view::npos && at + 1 < table.size()) {
    const size_t end = table.find('\n', at + 1);
    std::istringstream line{std::string(table.substr(at + 1, end - at - 1))};
    at = end;
    std::string ip, hw_type, flags, hw_address;
    if (!(line >> ip >> hw_type >> flags >> hw_address)) continue;
    const bool complete = (std::strtoul(flags.c_str(), nullptr, 16) & 0x2) != 0;  // ATF_COM
    if (complete && hw_address.size() == mac.size() &&
        std::equal(mac.begin(), mac.end(), hw_address.begin(),
                   [](char a, char b) { return std::tolower(a) == std::tolower(b); }))
      found.push_back(ip);
  }
  return found;
}

result<void> add_interface_address(const std::string& interface, const std::string& ipv4) {
  unsigned index = if_nametoindex(interface.c_str());
  in_addr address{};
  if (index == 0 || inet_pton(AF_INET, ipv4.c_str(), &address) != 1) {
    return Error(errc::invalid_config, index == 0 ? fmt::format("no network interface {}", interface)
                                                  : fmt::format("'{}' is not an IPv4 address", ipv4));
  }
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) {
    return Error(errc::invalid_config, fmt::format("netlink: {}", std::strerror(errno)));
  }
  struct {
    nlmsghdr header;
    ifaddrmsg body;
    char attributes[64];
  } request{};
  request.header.nlmsg_len = NLMSG_LENGTH(sizeof(ifaddrmsg));
  request.header.nlmsg_type = RTM_NEWADDR;
  request.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
  request.header.nlmsg_seq = 1;
  request.body.ifa_family = AF_INET;
  request.body.ifa_prefixlen = 32;
  request.body.ifa_scope = RT_SCOPE_UNIVERSE;
  request.body.ifa_index = index;
  add_attribute(&request.header, IFA_LOCAL, &address, sizeof address);
  add_attribute(&request.header, IFA_ADDRESS, &address, sizeof address);

  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  int error = 0;
  if (sendto(fd, &request, request.header.nlmsg_len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    error = errno;
  } else {
    char reply[1024];
    ssize_t n = recv(fd, reply, sizeof reply, 0);
    auto* header = reinterpret_cast<nlmsghdr*>(reply);
    if (n < 0) {
      error = errno;
    } else if (NLMSG_OK(header, size_t(n)) && header->nlmsg_type == NLMSG_ERROR) {
      error = -reinterpret_cast<nlmsgerr*>(NLMSG_DATA(header))->error;
    }
  }
  close(fd);
  if (error != 0 && error != EEXIST) {
    return Error(errc::invalid_config, fmt::format("adding {} to {}: {}", ipv4, interface, std::strerror(error)));
  }
  return {};
}

}  // namespace toyvm
