#pragma once
// A guest's serial console is the guest's own bytes: printed raw, escape sequences in it
// would drive the operator's terminal (retitle it, move the cursor, hide text).

#include <string>
#include <string_view>

namespace toyvm {

// The console text safe for a terminal: newline and tab stay, "\r\n" becomes "\n", other
// control characters are shown in caret notation (ESC as "^["), and C1 controls and bytes
// that are not UTF-8 become U+FFFD.
std::string printable_console(std::string_view text);
// The same for a value printed on one line (a name, a reason): newlines and tabs too in caret
// notation, so that it cannot make a line of its own.
std::string printable_line(std::string_view text);

// What a newer tail of a console adds to an older one: the text after the older tail's last
// 256 bytes, found in the newer one; all of it when they do not overlap (the console ran
// further than a tail holds between the two).
std::string_view console_growth(std::string_view before, std::string_view after);

}  // namespace toyvm
