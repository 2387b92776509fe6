#pragma once
// One instance etcd assigns to this host. It alone holds and changes what the agent knows of
// it (model/instance_knowledge.hpp): the work etcd asks for, the phase this host recorded, the
// guest's address, its move. News reaches it as messages (its work changed, its domain started
// or stopped, an address was found) on the agent's one event loop; it runs its steps one at a
// time, each towards what next_step(), decide() and decide_move() say, and publishes what others
// read (the host's figures, the metadata service).

#include "model/instance_knowledge.hpp"
#include "model/moves.hpp"
#include "model/reconcile.hpp"
#include "services/compute/builder.hpp"
#include "services/compute/context.hpp"
#include "services/compute/mover.hpp"
#include "services/compute/presence.hpp"
#include "services/compute/recorder.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace toyvm::compute {

// What every instance's steps use; the agent owns it.
struct InstanceSteps {
  AgentContext& ctx;
  InstanceRecorder& recorder;
  Builder& builder;
  HostPresence& presence;
  Mover& mover;
  std::function<void(const std::string&)> forget;  // an instance with nothing left to do
};

// What a step leaves: nothing more to do until news comes (rest), another step at once
// (again), or another look in a moment (later: waiting on a peer, on a libvirt job). An error
// is logged once, by the instance's loop, and the step is tried again in a moment.
enum class Next { rest, again, later };
using Step = awaitable<result<Next>>;
// A step that is over once `done` is: at rest, or `done`'s error.
inline result<Next> rest_after(const result<void>& done) {
  if (!done) return done.error();
  return Next::rest;
}

// An actor: news reaches it only as messages (tell), which its own loop absorbs one at a time
// between steps, so a step never sees its state change under it. News that ends what a running
// step does (a destroy during a build, a stop or an abort during a live send) also interrupts
// that step. Only it writes its records.
class Instance : public std::enable_shared_from_this<Instance> {
 public:
  // `fresh`: first seen in a watch event, made after the agent's listing, so nothing can
  // have been recorded for it yet; otherwise what this host recorded is read back first.
  Instance(InstanceSteps& steps, std::string uuid, bool fresh);

  void tell(News news);

  // --- what it publishes (as of its last step) ---
  const std::string& uuid() const { return uuid_; }
  const WorkSpec* work() const { return known_.work ? &*known_.work : nullptr; }
  Phase phase() const { return known_.recorded(); }
  const std::string& ip() const { return known_.address.ip; }
  bool cancelled() const { return known_.cancelled(); }
  // Counts against the host's room.
  bool holds_work() const { return !known_.cancelled(); }
  // No step runs for it, and none is due.
  bool idle() const { return !running_; }
  // Known work and no step running: what its guest looks like may be recorded.
  bool at_rest() const { return known_.work && !running_ && !known_.work_unreadable; }
  enum class AddressSearch { none, looking, overdue };
  AddressSearch address_search(std::chrono::steady_clock::time_point now) const;

 private:
  awaitable<void> run(std::shared_ptr<Instance> self);
  // Absorbs one message; true when a step is due for it.
  bool take(const News& news);
  // Destroyed, or its work gone, as far as its state and its mailbox say.
  bool being_removed() const;
  Step step();
  Step reconcile();
  Step load_recorded();
  // Writes `record`; what was made becomes the instance's phase. errc::changed: its work left
  // this host.
  awaitable<result<void>> record(InstanceRecord record, std::vector<EtcdOp> also = {});
  awaitable<result<void>> record_state(const WorkSpec& spec, InstanceState state);
  InstanceRecord make_record(const WorkSpec& spec, InstanceState state) const;
  void look_for_address();

  // instance_steps.cpp
  Step build(WorkSpec spec);
  awaitable<std::optional<result<void>>> record_building_if_slow(WorkSpec spec, asio::steady_timer& patience);
  awaitable<Made> make_domain_in_time(WorkSpec spec, asio::steady_timer& patience);
  Step fail(WorkSpec spec, Error failure);
  awaitable<result<bool>> move_elsewhere(WorkSpec spec);
  Step release_held(WorkSpec spec);
  Step power_on_off(WorkSpec spec, bool on);
  awaitable<void> shut_down_gracefully();
  Step remove(WorkSpec spec);
  awaitable<result<void>> remove_domain();
  Step adopt_stop(WorkSpec spec, int64_t revision);
  Step record_crash(WorkSpec spec);
  Step recheck_work();
  Step remove_prepared();

  // instance_moves.cpp
  // The next step of its move, or nothing when the usual decision stands.
  awaitable<std::optional<result<Next>>> step_move();
  Step advance_move(MoveRecord next, int64_t revision);
  Step revert_move(MoveRecord move, int64_t revision, std::string why);
  Step migrate(MoveRecord move, int64_t revision);
  // A live send running is ended (an abort asked, or a stop or destroy): the guest stays here.
  void abort_sending(std::string_view why);
  // Whether the move's other host has an agent, or lost it only a moment ago.
  awaitable<result<bool>> peer_alive(const MoveRecord& move, bool source);
  Step copy_disk(MoveRecord move, int64_t revision, DomainState here);
  Step resize_here(MoveRecord move, int64_t revision, DomainState here);
  // The guest shut down (then its plug pulled) for a cold move or a resize.
  awaitable<result<void>> power_off_to_move(DomainState here);
  Step switch_over(MoveRecord move, int64_t revision);
  Step move_ended(MoveRecord move, int64_t revision);

  InstanceSteps& steps_;
  AgentContext& ctx_;
  const std::string uuid_;
  InstanceKnowledge known_;  // changed only by absorbing news and by its own steps
  std::deque<News> inbox_;   // news not absorbed yet
  bool running_ = false;     // its loop runs (a step, or news to absorb)

  // What the running step is in the middle of, for news that interrupts it.
  asio::steady_timer* image_wait_ = nullptr;  // a build waiting for its image
  struct Sending {
    bool abort_asked = false;
  };
  std::optional<Sending> sending_;  // its guest is being sent to another host live

  // Bookkeeping of its move's steps, not of the instance: since when libvirt has refused to
  // begin sending it (for now) in the move of this migration consumer, in a row; and the other
  // host of its move, and since when it has had no agent.
  struct SendRefused {
    std::string migration;
    std::chrono::steady_clock::time_point since;
  };
  std::optional<SendRefused> send_refused_;
  std::string peer_;
  std::optional<std::chrono::steady_clock::time_point> peer_gone_since_;
};

}  // namespace toyvm::compute
