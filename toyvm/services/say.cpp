#include "services/say.hpp"

#include <cstdio>

namespace toyvm {

void Terminal::line(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void Terminal::raw(std::string_view bytes) {
  std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  std::fflush(stdout);
}

void Terminal::note(std::string_view text) {
  std::fprintf(stderr, "toyvm: %.*s\n", int(text.size()), text.data());
}

int Terminal::finish(const Outcome& outcome) {
  if (outcome) return static_cast<int>(*outcome);
  note(outcome.error().message());
  return static_cast<int>(exit_code_for(outcome.error().code));
}

}  // namespace toyvm
