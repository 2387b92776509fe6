#pragma once
// Wakes a loop when a file in a directory is written or replaced (inotify), so it can act at
// once instead of at its next poll. Best effort: the loop keeps polling, and a directory that
// cannot be watched (absent, unreadable) only means no early wake-ups.

#include "core/async.hpp"
#include "core/stop.hpp"

#include <functional>
#include <string>

namespace toyvm {

// Calls `changed` on the loop after each write or rename into `dir`, until the stop is seen
// (at an event) or the watch fails; returns at once when `dir` cannot be watched.
awaitable<void> watch_directory(std::string dir, std::function<void()> changed, const StopSignal& stop);

}  // namespace toyvm
