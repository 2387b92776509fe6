#pragma once
// A service's stop as a signal: loops ask requested() between rounds, and every wait made
// through sleep() ends the moment it comes, so a stop is not held up by a minute's resync timer.

#include "core/async.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <set>

namespace toyvm {

class StopSignal {
 public:
  bool requested() const { return requested_; }

  void request() {
    requested_ = true;
    for (asio::steady_timer* sleeper : sleepers_) sleeper->cancel();
  }

  // Waits `delay`; false when the stop came first (or had come).
  awaitable<bool> sleep(std::chrono::steady_clock::duration delay) {
    asio::steady_timer timer(co_await asio::this_coro::executor, delay);
    co_return co_await wait(timer);
  }

  // Waits for `timer` as it is set, or its cancel by its owner; false when the stop came first.
  awaitable<bool> wait(asio::steady_timer& timer) {
    if (requested_) co_return false;
    sleepers_.insert(&timer);
    co_await timer.async_wait(asio::as_tuple(use_awaitable));
    sleepers_.erase(&timer);
    co_return !requested_;
  }

 private:
  bool requested_ = false;
  std::set<asio::steady_timer*> sleepers_;  // the waits under way, on the one event loop
};

}  // namespace toyvm
