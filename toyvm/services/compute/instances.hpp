#pragma once
// This host's instances, one Instance per uuid. Level-triggered: work from the feed (a watch
// event, a listing) and libvirt's lifecycle events are routed to the instance they are about,
// which steps itself towards its desired state; instances step in parallel. Others read the
// instances here and tell them news; none changes one.

#include "services/compute/context.hpp"
#include "services/compute/instance.hpp"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

namespace toyvm::compute {

class Instances {
 public:
  using Table = std::map<std::string, std::shared_ptr<Instance>>;

  // The parts every instance's steps use.
  Instances(AgentContext& ctx, InstanceRecorder& recorder, Builder& builder, HostPresence& presence, Mover& mover);

  // A put or delete under this host's work prefix; returns the instance it was about, if
  // it was one of ours.
  std::optional<std::string> apply(const WatchEvent& event) { return apply(event, false, nullptr); }
  // Everything under the work prefix: what is listed is applied, each with its domain as
  // libvirt lists it (nothing is done for one as it should be), work that vanished since is
  // removed, and domains nobody asked for are destroyed.
  awaitable<void> apply_listing(RangeResult listed);
  // A put or delete under the moves prefix: a move that names this host reaches its instance
  // (made for it on the destination, which has no work for it yet).
  void apply_move(const WatchEvent& event);
  // Every move in flight: each applied, and an instance whose move is no longer listed told so.
  awaitable<void> apply_move_listing(RangeResult listed);
  // libvirt says an instance's domain started, stopped or crashed: look at it now rather than
  // at the next resync.
  void observe(const std::string& uuid, bool started);

  const Table& all() const { return table_; }
  // How many hold work (count against the host's room).
  size_t holding_work() const;
  std::shared_ptr<Instance> find(const std::string& uuid) const;
  // The images this host's work names, for the image cache's trim.
  std::set<std::string> images_wanted() const;

 private:
  // `domains`: from a listing, the domains libvirt listed then (null: it did not say).
  std::optional<std::string> apply(const WatchEvent& event, bool listed, const DomainStates* domains);
  Instance& instance(const std::string& uuid, bool fresh);

  AgentContext& ctx_;
  InstanceSteps steps_;
  Table table_;
};

}  // namespace toyvm::compute
