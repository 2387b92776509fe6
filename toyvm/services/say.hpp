#pragma once
// How a command ends, and what it says on the way. Commands write their lines to a Say and
// return an Outcome; main alone prints (Terminal) and turns the outcome into the exit code.

#include "core/error.hpp"

#include <string>
#include <string_view>

namespace toyvm {

// How a command ends: the exit code it ended with (ok, or one that is itself an answer: NO
// ALLOCATIONS LEFT), or the error that ended it, which main prints once, as "toyvm: <message>",
// and turns into the exit code its category says.
using Outcome = result<ExitCode>;

// What a command says as it goes; commands write here, never to the streams.
class Say {
 public:
  virtual ~Say() = default;
  // A result line, on stdout, as it happens (a wait's states, a drain's moves).
  virtual void line(std::string_view text) = 0;
  // A remark for the operator, on stderr: something left alone, a wait that goes on.
  virtual void note(std::string_view text) = 0;
  // Output as it comes, not in lines (a guest's console), on stdout.
  virtual void raw(std::string_view bytes) = 0;
};

// Says it on stdout and stderr, a line at a time, each written out at once.
class Terminal final : public Say {
 public:
  void line(std::string_view text) override;
  void note(std::string_view text) override;
  void raw(std::string_view bytes) override;
  // The one place an outcome is told: an error's line on stderr. Its exit code.
  int finish(const Outcome& outcome);
};

}  // namespace toyvm
