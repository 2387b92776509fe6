#pragma once
// This host's work from etcd: a listing, then a watch from the listed revision; a broken
// stream or a compacted revision leads back to a fresh listing, and a full listing every
// resync_interval is the safety net for anything missed.

#include "services/compute/context.hpp"
#include "services/compute/instances.hpp"

#include <memory>

namespace toyvm::compute {

class WorkFeed {
 public:
  WorkFeed(AgentContext& ctx, Instances& instances) : ctx_(ctx), instances_(instances) {}

  // Until stop().
  awaitable<void> follow();
  awaitable<void> resync_periodically();
  void stop();

 private:
  AgentContext& ctx_;
  Instances& instances_;
  std::unique_ptr<EtcdWatch> watch_;
};

}  // namespace toyvm::compute
