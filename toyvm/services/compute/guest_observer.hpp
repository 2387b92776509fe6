#pragma once
// What the agent learns from running guests: their DHCP addresses (libvirt has no event for
// a lease, so it looks twice a second, and at once when libvirt's dnsmasq records a lease)
// and the tail of their serial consoles, published only
// while someone asks for one (`toyvm show --console`), under the asker's lease: a guest that
// talks to its console costs etcd nothing unless someone reads it. Usage (CPU, memory, disk)
// is answered the same way, for `toyvm show <uuid>`.

#include "services/compute/context.hpp"
#include "services/compute/instances.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace toyvm::compute {

class GuestObserver {
 public:
  GuestObserver(AgentContext& ctx, const Instances& instances) : ctx_(ctx), instances_(instances), tick_(ctx.io) {}

  // Until the agent stops.
  awaitable<void> run();
  // Wakes run() whenever libvirt's dnsmasq writes its leases, until the agent stops.
  awaitable<void> watch_leases();
  // Follows the console requests for this host's instances, until the agent stops.
  awaitable<void> follow_console_requests();
  // Follows the usage requests for this host's instances, until the agent stops: each is
  // answered once, with two samples a second apart (the CPU's share needs two).
  awaitable<void> follow_usage_requests();
  // run() looks now: an instance came to rest looking for an address, or the leases changed.
  void wake();

 private:
  awaitable<void> find_address(std::string uuid);
  awaitable<void> publish_consoles(std::vector<std::string> uuids);
  awaitable<void> answer_usage(std::string uuid, int64_t lease);
  void take_usage_request(const KeyValue& kv);

  void apply_request(const KeyValue& kv, bool erased);

  AgentContext& ctx_;
  const Instances& instances_;
  struct ConsoleAsker {
    int64_t lease = 0;
    std::string project;  // the instance's, as the request says: where its copy goes
  };
  std::map<std::string, std::map<std::string, ConsoleAsker>> console_requests_;  // instance -> asker
  std::map<std::string, int64_t> console_published_;  // instance -> console log size last put in etcd
  std::chrono::steady_clock::time_point next_console_;
  asio::steady_timer tick_;
  bool woken_ = false;  // a wake-up that came while run() was not waiting
};

}  // namespace toyvm::compute
