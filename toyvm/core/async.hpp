#pragma once
// The Asio side of toyvm's concurrency: one io_context per process, C++20 coroutines, and
// two bridges for work that completes on other threads (gRPC callbacks, blocking libvirt).

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace toyvm {

namespace asio = boost::asio;
template <class T>
using awaitable = asio::awaitable<T>;
using asio::use_awaitable;
// Errors as values: `auto [ec, ...] = co_await op(..., no_throw)` returns what failed, never throws it.
inline constexpr auto no_throw = asio::as_tuple(use_awaitable);

// A queue that any thread may push to and one coroutine pops from. It is how completions
// from gRPC's threads enter the Asio loop without a thread per stream.
template <class T>
class AsyncQueue {
 public:
  void push(T value) {
    std::unique_lock lock(mutex_);
    if (waiter_) {
      Waiter waiter = std::move(*waiter_);
      waiter_.reset();
      lock.unlock();
      deliver(std::move(waiter), std::move(value));
      return;
    }
    items_.push_back(std::move(value));
  }

  // Completes with the next item; at most one pop may be outstanding.
  template <class Token = asio::use_awaitable_t<>>
  auto async_pop(Token token = {}) {
    return asio::async_initiate<Token, void(T)>(
        [this](auto handler) {
          auto executor = asio::get_associated_executor(handler);
          Waiter waiter{asio::any_completion_handler<void(T)>(std::move(handler)),
                        asio::any_io_executor(executor)};
          std::unique_lock lock(mutex_);
          if (!items_.empty()) {
            T value = std::move(items_.front());
            items_.pop_front();
            lock.unlock();
            deliver(std::move(waiter), std::move(value));
            return;
          }
          waiter_.emplace(std::move(waiter));
        },
        token);
  }

  size_t size() const {
    std::lock_guard lock(mutex_);
    return items_.size();
  }

 private:
  struct Waiter {
    asio::any_completion_handler<void(T)> handler;
    asio::any_io_executor executor;
  };
  static void deliver(Waiter waiter, T value) {
    auto executor = waiter.executor;
    asio::post(executor, [handler = std::move(waiter.handler), value = std::move(value)]() mutable {
      std::move(handler)(std::move(value));
    });
  }

  mutable std::mutex mutex_;
  std::deque<T> items_;
  std::optional<Waiter> waiter_;
};

// Runs `fn` on `pool` and resumes the calling coroutine on its own executor with the result.
// For blocking calls (libvirt, the file system) that must not stall the event loop.
template <class Fn>
auto run_blocking(asio::thread_pool& pool, Fn fn) -> awaitable<decltype(fn())> {
  using R = decltype(fn());
  auto queue = std::make_shared<AsyncQueue<std::optional<R>>>();
  asio::post(pool, [queue, fn = std::move(fn)]() mutable { queue->push(std::optional<R>(fn())); });
  std::optional<R> value = co_await queue->async_pop();
  co_return std::move(*value);
}

// Runs the tasks side by side on the caller's executor and returns when all have ended; then
// what the first that threw threw is thrown on.
inline awaitable<void> run_together(std::vector<awaitable<void>> tasks) {
  if (tasks.empty()) co_return;
  auto executor = co_await asio::this_coro::executor;
  using Spawned = decltype(asio::co_spawn(executor, std::declval<awaitable<void>>(), asio::deferred));
  std::vector<Spawned> spawned;
  for (awaitable<void>& task : tasks) spawned.push_back(asio::co_spawn(executor, std::move(task), asio::deferred));
  auto [order, thrown] = co_await asio::experimental::make_parallel_group(std::move(spawned))
                             .async_wait(asio::experimental::wait_for_all(), use_awaitable);
  for (size_t index : order)
    if (thrown[index]) std::rethrow_exception(thrown[index]);
}

}  // namespace toyvm
