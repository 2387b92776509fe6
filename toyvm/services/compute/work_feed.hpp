#pragma once
// Keys of etcd this agent follows (its work, the moves of guests): a listing, then a watch from
// the listed revision; a broken stream or a compacted revision leads back to a fresh listing.
// Every resync_interval the handlers are given the whole prefix again, the net for anything an
// instance missed: as the listing and the watch's events since say it (the watch delivers
// every change in order, so that is what a listing would say at the last event's revision),
// and every tenth time as etcd lists it, the net for a watch that stalls without a word. At
// 10,000 hosts those listings (358 a second) were more than half of etcd's work at rest.

#include "clients/etcd_mirror.hpp"
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
  EtcdMirror known_;  // the last listing, with the watch's events since
};

}  // namespace toyvm::compute
