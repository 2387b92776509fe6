#include "model/moves.hpp"

#include "model/uuid.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include <array>

namespace toyvm {
namespace {

namespace json = boost::json;

constexpr std::array<std::string_view, 3> kind_names{"live", "cold", "resize"};
constexpr std::array<std::string_view, 4> state_names{"preparing", "claimed", "switched", "reverting"};

template <class Enum, size_t N>
bool read_enum(std::string_view text, const std::array<std::string_view, N>& names, Enum& out) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == text) {
      out = static_cast<Enum>(i);
      return true;
    }
  }
  return false;
}

Error corrupt(std::string why) { return Error(errc::corrupt_record, "move record: " + std::move(why)); }

}  // namespace

std::string_view to_string(MoveKind kind) noexcept { return kind_names[size_t(kind)]; }
std::string_view to_string(MoveState state) noexcept { return state_names[size_t(state)]; }

std::string encode(const MoveRecord& move) {
  return json::serialize(json::object{{"instance", move.instance},
                                      {"migration", move.migration},
                                      {"source", move.source},
                                      {"destination", move.destination},
                                      {"kind", to_string(move.kind)},
                                      {"state", to_string(move.state)},
                                      {"started_at", move.started_at}});
}

result<MoveRecord> decode_move(std::string_view text) {
  simdjson::dom::parser parser;
  simdjson::dom::object doc;
  if (parser.parse(text.data(), text.size()).get(doc)) return corrupt("malformed JSON");
  MoveRecord move;
  for (auto [name, field] : {std::pair{"instance", &move.instance}, std::pair{"migration", &move.migration},
                             std::pair{"source", &move.source}, std::pair{"destination", &move.destination}}) {
    std::string_view value;
    if (doc[name].get_string().get(value) || !is_uuid(value)) return corrupt(fmt::format("missing or invalid {}", name));
    field->assign(value);
  }
  std::string_view kind, state;
  if (doc["kind"].get_string().get(kind) || !read_enum(kind, kind_names, move.kind))
    return corrupt(fmt::format("unknown kind '{}'", kind));
  if (doc["state"].get_string().get(state) || !read_enum(state, state_names, move.state))
    return corrupt(fmt::format("unknown state '{}'", state));
  if (doc["started_at"].get_int64().get(move.started_at)) return corrupt("missing or invalid started_at");
  return move;
}

}  // namespace toyvm
