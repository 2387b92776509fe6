#pragma once
// Level-triggered: every instance etcd assigns to this host is stepped towards its desired
// state, one step at a time per instance and instances in parallel, on every piece of news
// (a watch event, a listing) and again after a failed step.

#include "services/compute/builder.hpp"
#include "services/compute/context.hpp"
#include "services/compute/presence.hpp"
#include "services/compute/recorder.hpp"
#include "services/compute/slots.hpp"

#include <optional>
#include <string>

namespace toyvm::compute {

class Reconciler {
 public:
  struct Parts {
    InstanceSlots& slots;
    InstanceRecorder& recorder;
    Builder& builder;
    HostPresence& presence;
  };
  Reconciler(AgentContext& ctx, Parts parts) : ctx_(ctx), parts_(parts) {}

  // A put or delete under this host's work prefix; returns the instance it was about, if
  // it was one of ours.
  std::optional<std::string> apply(const WatchEvent& event) { return apply(event, false); }
  // Everything under the work prefix: what is listed is applied, work that vanished since is
  // removed, and domains nobody asked for are destroyed.
  awaitable<void> apply_listing(RangeResult listed);
  // libvirt says an instance's domain started, stopped or crashed: look at it now rather than
  // at the next resync.
  void observe(const std::string& uuid, bool started);

 private:
  // `listed`: from a listing, so the work may predate this agent and what it recorded must
  // be read back; work first seen in a watch event was made after the listing.
  std::optional<std::string> apply(const WatchEvent& event, bool listed);
  void kick(const std::string& uuid);
  awaitable<void> reconcile_loop(std::string uuid);
  awaitable<bool> reconcile_once(std::string uuid);
  awaitable<bool> power(WorkSpec spec, bool on);
  awaitable<void> shut_down_gracefully(std::string uuid);
  awaitable<bool> remove(WorkSpec spec);
  awaitable<bool> remove_domain(std::string uuid);
  awaitable<bool> adopt_stop(WorkSpec spec, int64_t revision);
  awaitable<bool> record_crash(WorkSpec spec);

  AgentContext& ctx_;
  Parts parts_;
  std::chrono::milliseconds retry_delay_ = std::chrono::seconds(1);
};

}  // namespace toyvm::compute
