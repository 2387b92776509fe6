#include "model/placement_error.hpp"

#include <simdjson.h>

namespace toyvm {

Error classify_placement_error(int status, std::string_view body) {
  Error out;
  std::string_view placement_code;
  simdjson::dom::parser parser;
  simdjson::dom::element first;
  if (!parser.parse(body.data(), body.size()).at_pointer("/errors/0").get(first)) {
    std::string_view text;
    if (!first["code"].get_string().get(text)) placement_code = text;
    if (!first["detail"].get_string().get(text)) out.detail = std::string(text);
  } else {
    // Not Placement's error format (a proxy, a crash page): keep the start of the body.
    out.detail = std::string(body.substr(0, 200));
  }
  // Placement's details run over several lines; one line reads better in a message.
  for (char& c : out.detail) {
    if (c == '\n') c = ' ';
  }
  if (status == 409) {
    if (placement_code == "placement.concurrent_update") {
      const bool consumer = out.detail.find("consumer generation conflict") != std::string::npos;
      out.code = consumer ? errc::placement_consumer_changed : errc::placement_concurrent_update;
    } else if (out.detail.find("exceed the capacity") != std::string::npos ||
               out.detail.find("Unable to allocate inventory") != std::string::npos) {
      out.code = errc::placement_capacity;
    } else {
      out.code = errc::placement_conflict;
    }
  } else if (status == 400) {
    out.code = errc::invalid_argument;  // the query itself, e.g. an unknown trait
  } else if (status == 404) {
    out.code = errc::not_found;
  } else if (status >= 500) {
    out.code = errc::placement_unavailable;
  } else {
    out.code = errc::placement_error;
  }
  return out;
}

std::string unknown_trait(const Error& refusal) {
  if (refusal != errc::invalid_argument) return {};
  constexpr std::string_view said = "No such trait(s): ";
  const std::string_view detail = refusal.detail;
  const size_t at = detail.find(said);
  if (at == std::string_view::npos) return {};
  const std::string_view rest = detail.substr(at + said.size());
  return std::string(rest.substr(0, rest.find_first_of(".,; ")));
}

}  // namespace toyvm
