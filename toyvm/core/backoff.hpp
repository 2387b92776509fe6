#pragma once
// Capped exponential backoff, for waiting on a server that may come back (etcd, Placement,
// libvirt): each wait doubles the next one up to a cap; news that it answers resets it.

#include "core/async.hpp"

#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>

namespace toyvm {

class Backoff {
 public:
  using clock = std::chrono::steady_clock;

  explicit Backoff(std::chrono::milliseconds first = std::chrono::milliseconds(100),
                   std::chrono::milliseconds cap = std::chrono::seconds(5))
      : first_(first), next_(first), cap_(cap) {}

  // Waits the current delay, or until `until` if that comes first; then doubles the delay.
  awaitable<void> wait(clock::time_point until = clock::time_point::max()) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    const clock::time_point now = clock::now();
    timer.expires_at(until - now < next_ ? until : now + next_);
    co_await timer.async_wait(use_awaitable);
    next_ = std::min(next_ * 2, cap_);
  }

  void reset() { next_ = first_; }
  // No wait since the last reset: the first failure of a run, the one worth a log line.
  bool fresh() const { return next_ == first_; }

 private:
  std::chrono::milliseconds first_, next_, cap_;
};

}  // namespace toyvm
