#pragma once
// The instance records this host writes: every write is guarded by the instance's work key,
// so a late write never resurrects an instance that was removed meanwhile. Stateless: what
// a write means for the instance is the instance's own business.

#include "services/compute/context.hpp"

#include <optional>
#include <string>
#include <vector>

namespace toyvm::compute {

class InstanceRecorder {
 public:
  explicit InstanceRecorder(AgentContext& ctx) : ctx_(ctx) {}

  // The record of `spec` in `state` on this host; an ACTIVE one carries the guest's address
  // (`ip`, empty while unknown; `no_address`: it was looked for in vain).
  InstanceRecord make(const WorkSpec& spec, InstanceState state, std::string ip = {}, bool no_address = false) const;
  // Made, or an error: errc::changed when refused because the work key is gone (the work
  // left this host), or etcd's own when it did not answer (a timed-out write may still have
  // been made). (A write etcd refused counts as unanswered: say, `also` put a key under a
  // lease that has just expired. The next round records the state again.) `also`: more
  // writes in the same transaction.
  awaitable<result<void>> write(InstanceRecord record, std::vector<EtcdOp> also = {});
  // What this host recorded for `uuid`: nothing when there is no record or it is another
  // host's (or cannot be read); an error when etcd did not answer.
  awaitable<result<std::optional<InstanceRecord>>> read(std::string uuid);

 private:
  AgentContext& ctx_;
};

}  // namespace toyvm::compute
