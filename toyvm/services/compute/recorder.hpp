#pragma once
// The instance records this host writes: every write is guarded by the instance's work key,
// so a late write never resurrects an instance that was removed meanwhile.

#include "services/compute/context.hpp"
#include "services/compute/slots.hpp"

namespace toyvm::compute {

class InstanceRecorder {
 public:
  InstanceRecorder(AgentContext& ctx, InstanceSlots& slots) : ctx_(ctx), slots_(slots) {}

  // The record of `spec` in `state` on this host, with the guest's address when ACTIVE.
  InstanceRecord make(const WorkSpec& spec, InstanceState state);
  // What became of a write: made; refused because the work key is gone (the work left this
  // host); or unknown, since etcd did not answer (a timed-out write may still have been made).
  // (A write etcd refused counts as unanswered: say, `also` put a key under a lease that has
  // just expired. The next round records the state again.)
  enum class Written { made, work_gone, unanswered };
  // `also`: more writes in the same transaction.
  awaitable<Written> write_checked(InstanceRecord record, std::vector<EtcdOp> also = {});
  // true when made.
  awaitable<bool> write(InstanceRecord record);
  // Writes `state`; a guest that just became ACTIVE is looked for an address afresh.
  awaitable<bool> record(WorkSpec spec, InstanceState state);
  // Writes `state` for a domain just made: whatever address an earlier guest of this
  // instance had is forgotten, and the new one looked for.
  awaitable<Written> record_made(WorkSpec spec, InstanceState state, std::vector<EtcdOp> also);
  // What the instance key says this host recorded, into the slot: memory is empty after a
  // restart, and an ERROR decided before it must stay ERROR. false when etcd did not answer.
  awaitable<bool> load(std::string uuid);

 private:
  AgentContext& ctx_;
  InstanceSlots& slots_;
};

}  // namespace toyvm::compute
