#pragma once
// One instance etcd assigns to this host. It alone holds and changes what the agent knows of
// it: the work etcd asks for, the phase this host recorded, the guest's address. News reaches
// it as calls (its work changed, its domain started or stopped, an address was found) on the
// agent's one event loop; it runs its steps one at a time, each towards what model/reconcile's
// decide() says, and publishes what others read (the host's figures, the metadata service).

#include "model/moves.hpp"
#include "model/reconcile.hpp"
#include "services/compute/builder.hpp"
#include "services/compute/context.hpp"
#include "services/compute/mover.hpp"
#include "services/compute/presence.hpp"
#include "services/compute/recorder.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
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

class Instance : public std::enable_shared_from_this<Instance> {
 public:
  // `fresh`: first seen in a watch event, made after the agent's listing, so nothing can
  // have been recorded for it yet; otherwise what this host recorded is read back first.
  Instance(InstanceSteps& steps, std::string uuid, bool fresh);

  // --- news ---
  // A put or delete of its work key. `listed`: from a listing, which may be older than what
  // it already knows.
  void take_work(const WatchEvent& event, bool listed);
  // A listing at `revision` no longer holds its work.
  void work_vanished(int64_t revision);
  // A move of it that names this host (as the source or the destination) was put; `move` is
  // empty when the value cannot be read.
  void take_move(const KeyValue& kv, std::optional<MoveRecord> move);
  // Its move record was deleted, or a listing at `revision` no longer holds it.
  void move_vanished(int64_t revision);
  // libvirt says its domain started, stopped or crashed, or that a domain without work exists.
  void domain_changed(bool started);
  void wake() { kick(); }
  // The guest's addresses as libvirt sees them; the one on its own NIC is recorded.
  void take_addresses(std::vector<GuestAddress> found);
  // address_timeout passed without one: recorded, so that whoever waits for it stops waiting.
  void give_up_address();

  // --- what it publishes ---
  const std::string& uuid() const { return uuid_; }
  const WorkSpec* work() const { return desired_ ? &*desired_ : nullptr; }
  Phase phase() const { return phase_.value_or(Phase::unrecorded); }
  const std::string& ip() const { return address_.ip; }
  // Destroy requested (or the work gone): a build in progress stops at its next stage.
  bool cancelled() const { return !desired_ || desired_->power == PowerState::deleted; }
  // Counts against the host's room.
  bool holds_work() const { return !cancelled(); }
  bool moving() const { return move_ || move_unreadable_; }
  // No step runs for it, and none is due.
  bool idle() const { return run_ == Run::idle; }
  // Known work and no step running: what its guest looks like may be recorded.
  bool at_rest() const { return desired_ && run_ == Run::idle && !unreadable_; }
  enum class AddressSearch { none, looking, overdue };
  AddressSearch address_search(std::chrono::steady_clock::time_point now) const;

 private:
  enum class Run { idle, stepping, again };  // `again`: news came during a step, run another

  void kick();
  awaitable<void> run(std::shared_ptr<Instance> self);
  // One step towards the desired state; false when it must be retried.
  awaitable<bool> step();
  awaitable<bool> load_recorded();
  // Writes `record`; what was made becomes the instance's phase.
  awaitable<InstanceRecorder::Written> record(InstanceRecord record, std::vector<EtcdOp> also = {});
  awaitable<bool> record_state(WorkSpec spec, InstanceState state);
  InstanceRecord make_record(const WorkSpec& spec, InstanceState state) const;
  void look_for_address();

  // instance_steps.cpp
  awaitable<bool> build(WorkSpec spec);
  awaitable<std::optional<bool>> record_building_if_slow(WorkSpec spec, asio::steady_timer& patience);
  awaitable<Made> make_domain_in_time(WorkSpec spec, asio::steady_timer& patience);
  awaitable<bool> fail(WorkSpec spec, Error failure);
  awaitable<result<bool>> move_elsewhere(WorkSpec spec);
  awaitable<bool> release_held(WorkSpec spec);
  awaitable<bool> power_on_off(WorkSpec spec, bool on);
  awaitable<void> shut_down_gracefully();
  awaitable<bool> remove(WorkSpec spec);
  awaitable<bool> remove_domain();
  awaitable<bool> adopt_stop(WorkSpec spec, int64_t revision);
  awaitable<bool> record_crash(WorkSpec spec);

  // instance_moves.cpp
  // The next step of its move, or nothing when the usual decision stands.
  awaitable<std::optional<bool>> step_move();
  awaitable<bool> advance_move(MoveRecord next, int64_t revision);
  awaitable<bool> revert_move(MoveRecord move, int64_t revision, std::string why);
  awaitable<bool> migrate(MoveRecord move, int64_t revision);
  // A live send running is ended (an abort asked, or a stop or destroy): the guest stays here.
  void abort_sending(const char* why);
  // Whether the move's other host has an agent, or lost it only a moment ago.
  awaitable<result<bool>> peer_alive(const MoveRecord& move, bool source);
  awaitable<bool> copy_disk(MoveRecord move, int64_t revision, DomainState here);
  awaitable<bool> resize_here(MoveRecord move, int64_t revision, DomainState here);
  // The guest shut down (then its plug pulled) for a cold move or a resize; false: retry.
  awaitable<bool> power_off_to_move(DomainState here);
  awaitable<bool> switch_over(MoveRecord move, int64_t revision);
  awaitable<bool> move_ended(MoveRecord move, int64_t revision);
  // Its work as etcd has it now: a move that ended may have taken it here or away, and the
  // work's own news may come later than the move's.
  awaitable<bool> recheck_work();

  InstanceSteps& steps_;
  AgentContext& ctx_;
  const std::string uuid_;
  std::optional<WorkSpec> desired_;  // empty: the work key is gone
  int64_t revision_ = 0;             // etcd revision of what `desired_` reflects; older news is stale
  // Its work value cannot be decoded (a newer writer's, or damaged): it is there, so it is no
  // reason to remove anything; nothing is done for the instance until it can be read.
  bool unreadable_ = false;
  std::optional<Phase> phase_;            // empty: what this host recorded is not read back yet
  std::optional<InstanceRecord> failure_;  // the ERROR record as last written or read
  bool allocation_elsewhere_ = false;     // a move that did not happen left it on another host
  struct Address {
    std::string ip;  // once libvirt knows it
    std::chrono::steady_clock::time_point deadline;  // stop looking for it then
    bool given_up = false;                           // the deadline passed
    bool unrecorded = false;                         // the ip or given_up is not in its record yet
  } address_;
  // A move of it in flight, as last read; its revision guards every write of the move.
  std::optional<MoveRecord> move_;
  int64_t move_revision_ = 0;
  bool move_unreadable_ = false;  // its move record cannot be read: nothing is decided for it
  bool recheck_work_ = false;     // a move ended: the work is read again before anything is decided
  bool prepared_here_ = false;    // a move here ended unseen: what was prepared for it goes unless its work came
  bool sending_ = false;          // its guest is being sent to another host live (a libvirt job runs)
  bool abort_asked_ = false;      // and that job was asked to end
  // Since when libvirt has refused to begin sending it (for now) in the move of this migration
  // consumer, in a row.
  struct SendRefused {
    std::string migration;
    std::chrono::steady_clock::time_point since;
  };
  std::optional<SendRefused> send_refused_;
  // The other host of its move, and since when it has had no agent (nothing: it has one).
  std::string peer_;
  std::optional<std::chrono::steady_clock::time_point> peer_gone_since_;
  Run run_ = Run::idle;
  asio::steady_timer* image_wait_ = nullptr;  // a build waiting for its image; ended by a destroy
};

}  // namespace toyvm::compute
