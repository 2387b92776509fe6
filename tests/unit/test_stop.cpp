#include "core/stop.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>

#include <chrono>

using namespace toyvm;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST_CASE("a periodic wait ends on the grid the process's loops share, never later than asked") {
  const Clock::duration step = StopSignal::grid_step;
  for (const Clock::duration offset : {Clock::duration(0), Clock::duration(1), Clock::duration(step / 2),
                                       Clock::duration(step - Clock::duration(1)), Clock::duration(step)}) {
    const Clock::time_point at = Clock::time_point(7 * step) + offset;
    const Clock::time_point point = StopSignal::grid_floor(at, step);
    CHECK(point <= at);
    CHECK(at - point < step);
    CHECK(point.time_since_epoch() % step == Clock::duration(0));
  }
  // Two loops asking at different moments within one step meet on the same point.
  CHECK(StopSignal::grid_floor(Clock::time_point(3 * step + 1ms), step) ==
        StopSignal::grid_floor(Clock::time_point(4 * step - 1ms), step));
}

TEST_CASE("a stop ends a periodic wait at once") {
  asio::io_context io;
  StopSignal stop;
  std::optional<bool> slept;
  asio::co_spawn(
      io, [&]() -> awaitable<void> { slept = co_await stop.sleep_on_grid(1h); }, asio::detached);
  asio::post(io, [&] { stop.request(); });
  io.run_for(5s);
  REQUIRE(slept.has_value());
  CHECK(*slept == false);
}
