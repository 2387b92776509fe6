#pragma once
// The scheduler service's batches: schedule requests that waited together are claimed in
// Placement together, one look for every request of one kind (the same query, zone and
// policy) and one POST /allocations for them all, as Nomad's plan applier applies many plans
// at once; or a few sent at once, split where they share no provider. Each request is still
// all or nothing, and is answered as if it had been taken alone; whatever a batch cannot
// decide exactly is left to be taken alone.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "core/async.hpp"
#include "core/config.hpp"
#include "model/keys.hpp"
#include "model/requests.hpp"
#include "services/placer.hpp"
#include "services/say.hpp"
#include "services/services.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace toyvm {

// A member's request as the service read it.
struct WaitingRequest {
  KeyValue kv;                        // requests/<project>/<id>
  std::string project, id;
  std::vector<EtcdCompare> standing;  // what every write of its answer requires
  std::string reply_key;
  ScheduleOptions options;
};

// What a schedule run for a member says, kept for its reply.
class RecordedSay final : public Say {
 public:
  void line(std::string_view text) override { lines.emplace_back(text); }
  void note(std::string_view text) override { lines.emplace_back(text); }
  void raw(std::string_view) override {}
  std::vector<std::string> lines;
};

// The reply of a schedule that did not answer in its hand-over.
ProjectReply reply_of(const Outcome& outcome, std::vector<std::string> lines);

// The answer to a request, written only while the request stands as `standing` says.
awaitable<void> answer_request(EtcdClient& etcd, std::vector<EtcdCompare> standing, std::string reply_key,
                               int64_t lease, const ProjectReply& reply);

// Looks made ahead, one for each kind of request a batch placed, while its hand-overs go
// (Placement counts its claims by then): the next batch of that kind plans in it instead of
// waiting for a look of its own, while it is fresh and asked for enough candidates. A look is
// a view, not a promise: Placement checks every claim against what it holds, and a request
// that does not fit is taken alone, which looks at the whole cloud.
struct LooksAhead {
  struct Look {
    explicit Look(asio::io_context& io, int limit) : limit(limit), arrived(io) {}
    std::chrono::steady_clock::time_point made = std::chrono::steady_clock::now();
    int limit = 0;                                // candidates asked for
    std::optional<result<PlacementView>> answer;  // nothing while it is on its way
    asio::steady_timer arrived;                   // cancelled when it comes; expires when stale
  };
  std::map<std::string, std::shared_ptr<Look>> by_kind;
};

// Claims for the requests together, under `hold_lease` (the service's), and hands each over
// or answers it. Returns those left to be taken alone, in their order: a project whose
// requests together would pass its quota, a request that fits nowhere in the look (alone, it
// asks the whole cloud, so "no room" still means no room anywhere), a claim that another came
// first to, a host disabled since the look.
awaitable<std::vector<WaitingRequest>> schedule_together(asio::io_context& io, const Config& config,
                                                         std::shared_ptr<EtcdClient> etcd, Placement& placement,
                                                         int64_t hold_lease, LooksAhead& ahead,
                                                         std::vector<WaitingRequest> requests);

}  // namespace toyvm
