// toyvm host disable / enable: take a host out of service and bring it back. The operator's
// intent is a key of its own in etcd, outside any lease; the host's agent follows it (the
// host record says DISABLED, the provider carries COMPUTE_STATUS_DISABLED) and keeps it
// across restarts. Disabling also sets the trait here, for a host whose agent is not
// running; enabling leaves the trait to the agent, the only one that takes it off.
//
// toyvm host drain: the host disabled, then each of its instances moved to another host
// (services/move_request.hpp), a few at a time, until nothing is on it or on its way to it
// (model/drain.hpp decides); it says what stayed and why.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "model/keys.hpp"
#include "model/drain.hpp"
#include "model/moves.hpp"
#include "model/records.hpp"
#include "services/common.hpp"
#include "services/move_request.hpp"
#include "services/placer.hpp"
#include "services/services.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>

namespace toyvm {
namespace {

class HostAdmin {
 public:
  HostAdmin(asio::io_context& io, const Config& config, const HostOptions& options, Say& say)
      : options_(options),
        say_(say),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        placement_(io.get_executor(), config.placement),
        placer_(placement_, *etcd_, config) {}

  awaitable<Outcome> run() {
    // A name (the agent's --name, Placement's provider name) or the provider's uuid.
    auto resolved = co_await resolve_host(placement_, options_.host);
    if (!resolved) co_return resolved.error();
    const std::string provider = *resolved;
    switch (options_.action) {
      case HostOptions::Action::disable: co_return co_await disable(provider);
      case HostOptions::Action::enable: co_return co_await enable(provider);
      case HostOptions::Action::drain: co_return co_await drain(provider);
    }
    co_return ExitCode::ok;
  }

 private:
  awaitable<Outcome> disable(const std::string& provider) {
    HostMaintenance maintenance{options_.reason, unix_seconds()};
    auto put = co_await etcd_->put(keys_.disabled(provider), encode(maintenance));
    if (!put) co_return etcd_error(*etcd_, put.error());
    // Traits its agent registers meanwhile stay: only this one is added, under the generation
    // read with the rest.
    if (auto marked = co_await placement_.add_trait(provider, std::string(disabled_trait)); !marked)
      co_return marked.error();
    say_.line(fmt::format("DISABLED HOST {} ({})", options_.host, provider));
    co_return ExitCode::ok;
  }

  awaitable<Outcome> enable(const std::string& provider) {
    auto erased = co_await etcd_->erase(keys_.disabled(provider));
    if (!erased) co_return etcd_error(*etcd_, erased.error());
    auto alive = co_await etcd_->range(keys_.host(provider));
    if (!alive) co_return etcd_error(*etcd_, alive.error());
    if (alive->kvs.empty())
      say_.note(fmt::format("host {} has no running agent: it takes work once its agent starts", options_.host));
    say_.line(fmt::format("ENABLED HOST {} ({})", options_.host, provider));
    co_return ExitCode::ok;
  }

  // Disables the host, then looks at it until nothing is left there or on its way: each running
  // or stopped guest is moved (`--parallel` at once), and what is still coming or going (a
  // schedule whose claim has not been handed over, a move heading here, a build, a destroy) is
  // waited for, up to the timeout. A schedule or move that meets the disabled host at its
  // hand-over goes elsewhere; one that got there first is moved once it has landed.
  awaitable<Outcome> drain(const std::string& provider) {
    if (auto disabled = co_await disable(provider); !disabled || *disabled != ExitCode::ok) co_return disabled;
    MoveRequests moves(*etcd_, placer_, keys_);
    auto executor = co_await asio::this_coro::executor;
    asio::steady_timer wake(executor);
    std::deque<std::string> queue;
    std::set<std::string> busy, stays;
    std::map<std::string, std::chrono::steady_clock::time_point> waiting;  // on its way, since
    int moved = 0, workers = 0;
    auto worker = [&]() -> awaitable<void> {
      while (!queue.empty()) {
        const std::string uuid = queue.front();
        queue.pop_front();
        auto ended = co_await move_one(moves, uuid);
        if (ended) {
          say_.line(fmt::format("MOVED INSTANCE {} TO {}", uuid, *ended));
          ++moved;
        } else {
          say_.line(fmt::format("STAYED INSTANCE {}: {}", uuid, ended.error().message()));
          stays.insert(uuid);
        }
        busy.erase(uuid);
        wake.cancel();
      }
    };
    const auto patience = std::chrono::duration_cast<std::chrono::steady_clock::duration>(options_.move_timeout);
    auto seen = std::chrono::steady_clock::now();  // when etcd and Placement last answered
    bool blind = false;  // they did not answer for too long: what is there is not known
    while (true) {
      auto look = co_await look_at(provider);
      const auto now = std::chrono::steady_clock::now();
      if (!look) {
        // Not looked at is not empty: nothing is said gone, and the moves under way go on.
        spdlog::warn("drain: looking at host {}: {}; looking again", options_.host, look.error().message());
        if (now - seen >= patience && !blind) {
          say_.note(fmt::format("host {} could not be looked at for {:g} s: {}", options_.host,
                                in_seconds(options_.move_timeout), look.error().message()));
          blind = true;
        }
        if (blind && busy.empty()) break;
        wake.expires_after(std::chrono::seconds(1));
        co_await wake.async_wait(asio::as_tuple(use_awaitable));
        continue;
      }
      seen = now;
      blind = false;
      DrainStep step = plan_drain(*look, busy);
      for (const auto& [uuid, why] : step.stay)
        if (stays.insert(uuid).second) say_.line(fmt::format("STAYED INSTANCE {}: {}", uuid, why));
      for (const std::string& uuid : step.move) {
        if (stays.count(uuid)) continue;  // its move was undone: it is not asked again
        busy.insert(uuid);
        queue.push_back(uuid);
      }
      std::map<std::string, std::chrono::steady_clock::time_point> still;
      for (const auto& [what, why] : step.wait) {
        auto [since, fresh] = waiting.emplace(what, now);
        if (fresh) say_.line(fmt::format("WAITING FOR {}: {}", what, why));
        if (stays.count(what)) continue;
        if (now - since->second < patience) {
          still.emplace(what, since->second);
        } else {
          say_.line(fmt::format("STAYED INSTANCE {}: {}, after {:g} s", what, why, in_seconds(options_.move_timeout)));
          stays.insert(what);
        }
      }
      for (const auto& [what, since] : waiting)
        if (!still.count(what) && !stays.count(what) && !busy.count(what))
          say_.line(fmt::format("GONE {}: no longer on its way to or from the host", what));
      waiting = std::move(still);
      for (; workers < options_.parallel && !queue.empty(); ++workers)
        asio::co_spawn(executor, worker(), [&](std::exception_ptr) {
          --workers;
          wake.cancel();
        });
      if (waiting.empty() && busy.empty()) break;
      wake.expires_after(std::chrono::seconds(1));
      co_await wake.async_wait(asio::as_tuple(use_awaitable));
    }
    while (workers > 0) {  // each has ended its last move; its completion is on its way
      wake.expires_after(std::chrono::seconds(1));
      co_await wake.async_wait(asio::as_tuple(use_awaitable));
    }
    say_.line(fmt::format("DRAINED HOST {} ({}): {} moved, {} stayed", options_.host, provider, moved, stays.size()));
    // What stayed, and why, is said above.
    co_return stays.empty() && !blind ? ExitCode::ok : ExitCode::failed;
  }

  // The host's work with its instances' states, every move from or to it, and every consumer
  // holding resources on its provider.
  awaitable<result<DrainLook>> look_at(const std::string& provider) {
    DrainLook look;
    auto works = co_await etcd_->range_prefix(keys_.work_prefix(provider));
    if (!works) co_return works.error();
    for (const KeyValue& kv : works->kvs) {
      auto uuid = keys_.parse_work(kv.key);
      if (!uuid) continue;
      DrainLook::Guest guest;
      guest.uuid = uuid->instance;
      auto work = decode_work(kv.value);
      guest.readable = work.has_value();
      if (work) guest.power = work->power;
      auto recorded = co_await etcd_->range(keys_.instance(uuid->instance));
      if (!recorded) co_return recorded.error();
      if (!recorded->kvs.empty())
        if (auto record = decode_instance(recorded->kvs.front().value)) guest.state = record->state;
      look.guests.push_back(std::move(guest));
    }
    auto in_flight = co_await etcd_->range_prefix(keys_.moves_prefix());
    if (!in_flight) co_return in_flight.error();
    for (const KeyValue& kv : in_flight->kvs)
      if (auto move = decode_move(kv.value); move && (move->source == provider || move->destination == provider))
        look.moves.push_back(std::move(*move));
    auto held = co_await placement_.provider_allocations(provider);
    if (!held) co_return held.error();
    for (const auto& [consumer, amounts] : *held) look.consumers.push_back(consumer);
    look.host = provider;
    co_return look;
  }

  // One instance asked to move and followed to its end: where it went, or why it stayed. A
  // running one moves live, a stopped one cold. A move that was undone is asked once more, cold
  // (the guest runs on where it was meanwhile): the host is to be emptied, and a guest that
  // cannot move live (its CPU, its disk, its dirty rate) still moves powered off.
  awaitable<result<std::string>> move_one(MoveRequests& moves, std::string uuid) {
    for (bool cold : {false, true}) {
      auto asked = co_await moves.ask(uuid, "", cold);
      if (!asked) co_return asked.error();
      say_.line(fmt::format("MOVING INSTANCE {} TO {}{}", uuid, asked->move.destination,
                            asked->move.kind == MoveKind::live ? "" : " (cold)"));
      auto ended = co_await moves.follow(*asked, options_.move_timeout);
      if (!ended) co_return ended.error();
      if (ended->moved) co_return ended->host;
      if (asked->move.kind != MoveKind::live) co_return Error(errc::changed, ended->error);
      say_.line(fmt::format("UNDONE INSTANCE {}: {}; asking again, cold", uuid, ended->error));
    }
    co_return Error(errc::changed, "not moved");
  }

  const HostOptions& options_;
  Say& say_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  PlacementClient placement_;
  Placer placer_;
};

}  // namespace

Outcome run_host(const Config& config, const HostOptions& options, Say& say) {
  return run_on_loop([&](asio::io_context& io) -> awaitable<Outcome> {
    HostAdmin admin(io, config, options, say);
    co_return co_await admin.run();
  });
}

}  // namespace toyvm
