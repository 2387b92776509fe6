#include "model/console.hpp"

#include <algorithm>

namespace toyvm {
namespace {

constexpr std::string_view replacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the well-formed UTF-8 sequence at the start of `text`, 0 if there is none.
size_t utf8_sequence(std::string_view text) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char lead = byte(0);
  size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
  if (lead < 0xC2 || lead > 0xF4 || text.size() < length) return 0;
  for (size_t i = 1; i < length; ++i)
    if ((byte(i) & 0xC0) != 0x80) return 0;
  // Overlong forms, UTF-16 surrogates and code points past U+10FFFF.
  if ((lead == 0xE0 && byte(1) < 0xA0) || (lead == 0xED && byte(1) > 0x9F) || (lead == 0xF0 && byte(1) < 0x90) ||
      (lead == 0xF4 && byte(1) > 0x8F))
    return 0;
  return length;
}

std::string printable(std::string_view text, bool lines) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if ((lines && (c == '\n' || c == '\t')) || (c >= 0x20 && c < 0x7F)) {
      out.push_back(char(c));
      ++i;
    } else if (lines && c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') {
      ++i;
    } else if (c < 0x20 || c == 0x7F) {
      out.push_back('^');
      out.push_back(c == 0x7F ? '?' : char(c + 0x40));
      ++i;
    } else if (size_t length = utf8_sequence(text.substr(i)); length == 0) {
      out += replacement;
      ++i;
    } else {
      bool c1_control = c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0;
      if (c1_control) out += replacement;
      else out.append(text.substr(i, length));
      i += length;
    }
  }
  return out;
}

}  // namespace

std::string printable_console(std::string_view text) { return printable(text, true); }
std::string printable_line(std::string_view text) { return printable(text, false); }

std::string_view console_growth(std::string_view before, std::string_view after) {
  if (before.empty()) return after;
  const std::string_view anchor = before.substr(before.size() - std::min<size_t>(before.size(), 256));
  size_t at = after.rfind(anchor);
  if (at == std::string_view::npos) return after;
  return after.substr(at + anchor.size());
}

}  // namespace toyvm
