#pragma once
// The build pipeline of one instance: the server group's late check, the image, the domain.
// A build that fails moves the instance to another host while attempts remain (Nova's
// alternates) or ends it in ERROR, which holds nothing.

#include "services/compute/context.hpp"
#include "services/compute/presence.hpp"
#include "services/compute/recorder.hpp"
#include "services/compute/slots.hpp"
#include "services/placer.hpp"
#include "virt/images.hpp"

#include <boost/asio/steady_timer.hpp>

#include <optional>
#include <set>

namespace toyvm::compute {

class Builder {
 public:
  struct Parts {
    InstanceSlots& slots;
    InstanceRecorder& recorder;
    ImageStore& images;
    Placer& placer;
    HostPresence& presence;
  };
  Builder(AgentContext& ctx, Parts parts) : ctx_(ctx), parts_(parts) {}

  // ACTIVE with a running domain (BUILDING meanwhile if that takes a while), or failed as
  // above; false when a step must be retried (a server did not answer).
  awaitable<bool> build(WorkSpec spec);
  // An ERROR instance gives back its allocation and group membership; both calls are
  // idempotent, so a release that failed, or one a restart forgot, is simply made again.
  awaitable<bool> release_held(WorkSpec spec);

 private:
  // What making the domain came to; nothing of it is recorded yet.
  struct Made {
    enum class Outcome { made, cancelled, failed, retry };
    explicit Made(Outcome outcome, std::string reason = {}, std::string message = {})
        : outcome(outcome), reason(std::move(reason)), message(std::move(message)) {}
    Outcome outcome;
    std::string reason, message;  // failed, retry
  };
  awaitable<Made> make_domain(WorkSpec spec);
  // make_domain, then `patience` cancelled.
  awaitable<Made> make_domain_in_time(WorkSpec spec, asio::steady_timer& patience);
  awaitable<std::optional<bool>> record_building_if_slow(WorkSpec spec, asio::steady_timer& patience);
  awaitable<std::optional<VirtResult<BootImage>>> acquire_image(WorkSpec spec);
  std::set<std::string> images_in_use() const;
  DomainSpec domain_spec(const WorkSpec& spec, const BootImage& image) const;
  awaitable<bool> fail(WorkSpec spec, std::string reason, std::string message);
  awaitable<result<bool>> move_elsewhere(WorkSpec spec);
  awaitable<bool> take_allocation_back(WorkSpec spec);
  awaitable<result<bool>> group_allows_here(WorkSpec spec);

  AgentContext& ctx_;
  Parts parts_;
};

}  // namespace toyvm::compute
