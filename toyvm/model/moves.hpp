#pragma once
// A guest moving between hosts (`toyvm migrate`, `resize`, `host drain`), as etcd keeps it at
// <prefix>/moves/<instance> from before its books change until they are settled. Both agents,
// `show` and `audit` see a move in flight by it, and whoever finds one after a crash knows
// where the resources are: the books follow Nova's protocol (a migration consumer of its own
// uuid holds the source's share while the instance claims the destination).

#include "core/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace toyvm {

enum class MoveKind { live, cold, resize };

enum class MoveState {
  preparing,  // written; the books are as before the move (the instance holds the source)
  claimed,    // the migration consumer holds the source, the instance the destination
  switched,   // the guest runs on the destination: the migration consumer's share is to go
  reverting,  // the guest stays on the source: the books are to be swapped back
};

struct MoveRecord {
  std::string instance;
  std::string migration;    // the migration consumer's uuid in Placement
  std::string source;       // providers
  std::string destination;
  MoveKind kind = MoveKind::live;
  MoveState state = MoveState::preparing;
  int64_t started_at = 0;   // unix milliseconds

  bool operator==(const MoveRecord&) const = default;
};

std::string_view to_string(MoveKind kind) noexcept;
std::string_view to_string(MoveState state) noexcept;

std::string encode(const MoveRecord& move);
// corrupt_record, saying why, for anything malformed, including a kind or state this
// reader does not know (a newer writer's): never read as another.
result<MoveRecord> decode_move(std::string_view json);

}  // namespace toyvm
