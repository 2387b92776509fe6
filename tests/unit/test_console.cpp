#include "model/console.hpp"

#include <catch2/catch.hpp>

using toyvm::printable_console;

TEST_CASE("console text keeps lines and tabs and defuses terminal control") {
  CHECK(printable_console("login:\tok\r\nnext\n") == "login:\tok\nnext\n");
  // An escape sequence that would retitle the terminal and clear the screen.
  CHECK(printable_console("a\x1b]0;owned\x07\x1b[2Jb") == "a^[]0;owned^G^[[2Jb");
  CHECK(printable_console(std::string("\0\x7f\rx", 4)) == "^@^?^Mx");
  CHECK(printable_console("caf\xC3\xA9 \xE2\x9C\x93") == "caf\xC3\xA9 \xE2\x9C\x93");  // UTF-8 stays
  CHECK(printable_console("\xC2\x9B" "31m") == "\xEF\xBF\xBD" "31m");  // C1 CSI
  CHECK(printable_console("\x9b\xff\xC3") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // not UTF-8
  CHECK(printable_console("\xE0\x80\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
}

TEST_CASE("a name or a reason printed on one line cannot make lines of its own or drive the terminal") {
  using toyvm::printable_line;
  CHECK(printable_line("web-1") == "web-1");
  CHECK(printable_line("a\nFAKE LINE\tx\r\n") == "a^JFAKE LINE^Ix^M^J");
  CHECK(printable_line("\x1b[2Jreason") == "^[[2Jreason");
  CHECK(printable_line("caf\xC3\xA9") == "caf\xC3\xA9");
}

TEST_CASE("console_growth: what a newer tail adds to an older one", "[console]") {
  using toyvm::console_growth;
  CHECK(console_growth("", "boot\n") == "boot\n");
  CHECK(console_growth("boot\n", "boot\nlogin: ") == "login: ");
  CHECK(console_growth("boot\n", "boot\n").empty());
  // The tail window moved on: the older tail's end is found further left.
  std::string before = std::string(300, 'a') + "0123456789";
  std::string after = std::string(260, 'a') + "0123456789" + "new";
  CHECK(console_growth(before, after) == "new");
  // Nothing in common: the newer tail is all new.
  CHECK(console_growth("old text", "entirely different") == "entirely different");
}
