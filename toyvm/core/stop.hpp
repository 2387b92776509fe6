#pragma once
// A service's stop as a signal: loops ask requested() between rounds, and every wait made
// through sleep() ends the moment it comes, so a stop is not held up by a minute's resync timer.

#include "core/async.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>

namespace toyvm {

class StopSignal {
 public:
  bool requested() const { return requested_; }

  void request() {
    requested_ = true;
    for (Sleeper* sleeper = sleepers_; sleeper; sleeper = sleeper->next) sleeper->timer.cancel();
  }

  // Waits `delay`; false when the stop came first (or had come).
  awaitable<bool> sleep(std::chrono::steady_clock::duration delay) {
    asio::steady_timer timer(co_await asio::this_coro::executor, delay);
    co_return co_await wait(timer);
  }

  // A periodic loop's wait: about `delay`, ending on a grid the process's loops share (at most
  // `delay`, at most a step less), so that loops of many hosts in one process (the simulated
  // hosts') wake together, a few times a second, rather than each alone. False as sleep().
  awaitable<bool> sleep_on_grid(std::chrono::steady_clock::duration delay) {
    if (delay < 2 * grid_step) co_return co_await sleep(delay);
    asio::steady_timer timer(co_await asio::this_coro::executor,
                             grid_floor(std::chrono::steady_clock::now() + delay, grid_step));
    co_return co_await wait(timer);
  }
  static constexpr std::chrono::steady_clock::duration grid_step = std::chrono::milliseconds(250);
  // The grid's last point at or before `at`.
  static std::chrono::steady_clock::time_point grid_floor(std::chrono::steady_clock::time_point at,
                                                          std::chrono::steady_clock::duration step) {
    return at - at.time_since_epoch() % step;
  }

  // Waits for `timer` as it is set, or its cancel by its owner; false when the stop came first.
  awaitable<bool> wait(asio::steady_timer& timer) {
    if (requested_) co_return false;
    Sleeper sleeping(*this, timer);
    co_await timer.async_wait(asio::as_tuple(use_awaitable));
    co_return !requested_;
  }

 private:
  // A wait under way, linked in for as long as it lasts (also when its coroutine is destroyed
  // mid-wait): a host process has tens of thousands, so joining and leaving cost nothing.
  struct Sleeper {
    Sleeper(StopSignal& signal, asio::steady_timer& timer) : signal(signal), timer(timer), next(signal.sleepers_) {
      if (next) next->prev = this;
      signal.sleepers_ = this;
    }
    ~Sleeper() {
      (prev ? prev->next : signal.sleepers_) = next;
      if (next) next->prev = prev;
    }
    Sleeper(const Sleeper&) = delete;
    Sleeper& operator=(const Sleeper&) = delete;

    StopSignal& signal;
    asio::steady_timer& timer;
    Sleeper* next = nullptr;
    Sleeper* prev = nullptr;
  };

  bool requested_ = false;
  Sleeper* sleepers_ = nullptr;  // on the one event loop
};

}  // namespace toyvm
