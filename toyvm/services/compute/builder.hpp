#pragma once
// The stages of building an instance on this host, each inputs in and outcome out: the
// server group's late check, the image, the domain; and, for a build that failed, the move to
// another host (Nova's alternates) and giving back what an ERROR instance holds. The
// instance strings them together and records what came of them.

#include "services/compute/context.hpp"
#include "services/compute/recorder.hpp"
#include "services/placer.hpp"
#include "virt/images.hpp"

#include <boost/asio/steady_timer.hpp>

#include <functional>
#include <optional>
#include <set>
#include <string>

namespace toyvm::compute {

// What making the domain came to; nothing of it is recorded yet.
struct Made {
  enum class Outcome { made, cancelled, failed, retry };
  explicit Made(Outcome outcome, Error failure = {}) : outcome(outcome), failure(std::move(failure)) {}
  Outcome outcome;
  Error failure;  // failed, retry
};

// How a build learns that its instance was destroyed meanwhile: asked between stages, and
// `wake` ends a wait (for an image) at once.
struct BuildCancel {
  std::function<bool()> requested;
  asio::steady_timer& wake;
};

class Builder {
 public:
  struct Parts {
    InstanceRecorder& recorder;
    ImageStore& images;
    Placer& placer;
    std::function<std::set<std::string>()> images_wanted;  // by every instance of this host
    std::function<std::optional<bool>()> disabled_as_followed;  // the agent's follower of the disable
  };
  Builder(AgentContext& ctx, Parts parts) : ctx_(ctx), parts_(std::move(parts)) {}

  // The domain of `spec`, defined and (if its work says so) started; half-made domains of a
  // failed attempt are destroyed.
  awaitable<Made> make_domain(WorkSpec spec, BuildCancel cancel);
  // The domain of `spec` as a guest arriving from another host has it here (its image
  // fetched if need be; `ip` the address it keeps), for VirtBackend::prepare_incoming.
  awaitable<result<DomainSpec>> incoming_domain(WorkSpec spec, std::string ip);
  // Nova's late check: concurrent schedules and moves may have put members of a hard group
  // against its policy; the member that came later (created, or its move asked) gives way.
  // Also the destination's check before a move of a member arrives (model/groups.hpp).
  awaitable<result<bool>> group_allows_here(WorkSpec spec);
  // An operator took this host out of service (`host disable`, `host drain`): it takes nothing
  // new, built or moved here. As the agent's follower of the disable last heard it; read from
  // etcd only before that has heard.
  awaitable<result<bool>> host_disabled();
  // Moves `work` (as of `revision`, its next attempt) to another live host (Placer::relocate).
  awaitable<result<Relocated>> move_elsewhere(WorkSpec work, int64_t revision);
  // After a move that did not happen, the instance's allocation comes back to this host,
  // from wherever it is; errc::not_ready while it cannot.
  awaitable<result<void>> take_allocation_back(WorkSpec spec);
  // The allocation and the group membership given back; both idempotent, so a release that
  // failed, or one a restart forgot, is simply made again.
  awaitable<result<void>> give_back(WorkSpec spec);

 private:
  awaitable<std::optional<result<BootImage>>> acquire_image(WorkSpec spec, asio::steady_timer& wake);
  DomainSpec domain_spec(const WorkSpec& spec, const BootImage& image) const;

  AgentContext& ctx_;
  Parts parts_;
};

}  // namespace toyvm::compute
