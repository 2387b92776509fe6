#pragma once
// Keys of etcd this agent follows (its work, the moves of guests): a listing, then a watch from
// the listed revision; a broken stream or a compacted revision leads back to a fresh listing,
// and a full listing every resync_interval is the safety net for anything missed.

#include "services/compute/context.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace toyvm::compute {

class KeyFeed {
 public:
  struct Handlers {
    std::function<awaitable<void>(RangeResult)> listed;  // everything under the prefix
    std::function<void(const WatchEvent&)> changed;      // one put or delete after it
  };
  KeyFeed(AgentContext& ctx, std::string prefix, Handlers handlers)
      : ctx_(ctx), prefix_(std::move(prefix)), handlers_(std::move(handlers)) {}

  // The first listing, applied, before anything else is decided (retried until etcd answers).
  awaitable<void> load();
  // Until stop(); watches from load()'s listing when there was one.
  awaitable<void> follow();
  awaitable<void> resync_periodically();
  void stop();

 private:
  awaitable<result<void>> list();

  AgentContext& ctx_;
  const std::string prefix_;
  Handlers handlers_;
  std::optional<int64_t> listed_;  // the revision of a listing no watch follows yet
  std::unique_ptr<EtcdWatch> watch_;
};

}  // namespace toyvm::compute
