#pragma once
// Failpoints: named places where a test makes a process misbehave on purpose, to stage the
// moment between two steps that no outside fault can reach (as etcd's gofail does).
//
//   TOYVM_FAILPOINTS="name=action[;name=action...]"
//   action: throw         every time the point is passed, throw
//           N*throw       the first N times
//           pause(PATH)   wait there while PATH exists
//
// Unset (always, outside tests), passing a point finds nothing armed and returns at once.

#include "core/async.hpp"

#include <string_view>

namespace toyvm::failpoint {

// Passes the point named `name`: throws or waits as TOYVM_FAILPOINTS says, else returns at once.
awaitable<void> pass(std::string_view name);

}  // namespace toyvm::failpoint
