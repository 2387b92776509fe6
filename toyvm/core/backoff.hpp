#pragma once
// Capped exponential backoff, for waiting on a server that may come back (etcd, Placement,
// libvirt): each wait doubles the next one up to a cap; news that it answers resets it. Each
// wait is somewhere in the second half of its delay, so that clients a server lost together
// (ten thousand hosts of one etcd) do not all come back at the same instant.

#include "core/async.hpp"

#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>

namespace toyvm {

class Backoff {
 public:
  using clock = std::chrono::steady_clock;

  explicit Backoff(std::chrono::milliseconds first = std::chrono::milliseconds(100),
                   std::chrono::milliseconds cap = std::chrono::seconds(5))
      : first_(first), next_(first), cap_(cap),
        jitter_(uint32_t(clock::now().time_since_epoch().count()) ^ uint32_t(reinterpret_cast<uintptr_t>(this))) {}

  // Waits the current delay (from half of it to all, at random), or until `until` if that comes
  // first; then doubles the delay.
  awaitable<void> wait(clock::time_point until = clock::time_point::max()) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    const clock::time_point now = clock::now();
    const auto delay = next_ / 2 + std::chrono::milliseconds(jitter_() % (next_.count() / 2 + 1));
    timer.expires_at(until - now < delay ? until : now + delay);
    co_await timer.async_wait(use_awaitable);
    next_ = std::min(next_ * 2, cap_);
  }

  void reset() { next_ = first_; }
  // No wait since the last reset: the first failure of a run, the one worth a log line.
  bool fresh() const { return next_ == first_; }

 private:
  std::chrono::milliseconds first_, next_, cap_;
  std::minstd_rand jitter_;
};

}  // namespace toyvm
