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

}  // namespace toyvm
