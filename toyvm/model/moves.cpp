#include "model/moves.hpp"

#include "model/query.hpp"
#include "model/uuid.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <array>

namespace toyvm {
namespace {

namespace json = boost::json;

constexpr std::array<std::string_view, 3> kind_names{"live", "cold", "resize"};
constexpr std::array<std::string_view, 7> state_names{"preparing", "claimed",   "ready", "left_source",
                                                     "switched",  "reverting", "copied"};
constexpr std::array<std::string_view, 11> action_names{
    "none", "prepare", "migrate", "left", "switch_over", "settle", "revert", "unwind", "clean_up", "copy",
    "resize_here"};

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

std::string_view to_string(MoveAction action) noexcept { return action_names[size_t(action)]; }

MoveAction decide_move(const MoveView& view) {
  using enum MoveAction;
  // Whether the source goes on with it: still asked for, in time, and not aborted.
  const bool go_on = view.still_wanted && !view.overdue && !view.aborted;
  if (view.in_place) {
    switch (view.state) {
      case MoveState::preparing: return go_on ? none : revert;
      case MoveState::claimed:
        if (view.here == DomainState::absent) return revert;
        return view.still_wanted && !view.aborted ? resize_here : revert;
      case MoveState::switched: return settle;
      case MoveState::reverting: return unwind;
      default: return none;  // no other state is written for a move in place
    }
  }
  if (view.source) {
    switch (view.state) {
      // Its asker claims a host for it, and the destination then prepares, in time.
      case MoveState::preparing: return go_on ? none : revert;
      case MoveState::claimed: return go_on && view.peer_alive ? none : revert;
      case MoveState::ready:
        // A job still running may yet take the guest there (an abort ends it, and libvirt
        // leaves the guest here). Cold: its disk goes while the guest is off here; a guest gone
        // from here has nothing to send.
        if (view.job) return none;
        if (view.kind != MoveKind::live)
          return view.here != DomainState::absent && view.still_wanted && !view.aborted && view.peer_alive ? copy
                                                                                                           : revert;
        // Once it is not here, only the destination can tell whether it runs there: asked,
        // after this look. So too for a guest that a send libvirt could not finish left
        // paused here (it is resumed if the move is undone, removed if it ran there).
        if (view.here == DomainState::absent || view.here == DomainState::paused) return left;
        return view.here == DomainState::running && view.still_wanted && !view.aborted && view.peer_alive ? migrate
                                                                                                          : revert;
      // The guest left here: it runs on the destination or nowhere. A destination gone for good
      // cannot say which; the work follows the books there, and evacuating that dead host
      // rebuilds it.
      case MoveState::left_source: return view.peer_alive ? none : switch_over;
      // Its disk is there, the guest off here: a destination gone for good never defines it,
      // and the guest runs here again.
      case MoveState::copied: return view.peer_alive ? none : revert;
      case MoveState::switched: return settle;
      case MoveState::reverting: return unwind;
    }
    return none;
  }
  switch (view.state) {
    // Nothing is prepared for a source gone for good: it will not send anything.
    case MoveState::claimed: return view.peer_alive ? prepare : revert;
    case MoveState::ready:
      if (view.job) return none;
      if (view.kind != MoveKind::live) return view.peer_alive ? none : revert;
      if (view.here == DomainState::running) return switch_over;
      // Not here, and its source gone for good: it was never sent, and stays where it was.
      return view.here == DomainState::absent && !view.peer_alive ? revert : none;
    // Its disk is here, the guest off on the source: defined here, then its work follows.
    case MoveState::copied: return switch_over;
    // The source has not had it since before this look: here, or nowhere.
    // A copy paused here is libvirt's to resume or remove first.
    case MoveState::left_source:
      if (view.job || view.here == DomainState::paused) return none;
      return view.here == DomainState::absent ? revert : switch_over;
    // A guest running here is never removed on a guess: it cannot be while the move reverts
    // (a paused copy goes once the move is over and its work is not here).
    case MoveState::reverting:
      return view.here == DomainState::running || view.here == DomainState::paused ? none : clean_up;
    // The source ends a move once its guest has left it (its files and its domain's key go
    // with the record); the destination does when the source died before it could.
    case MoveState::switched: return view.peer_alive ? none : settle;
    case MoveState::preparing: return none;
  }
  return none;
}

MoveView dead_source_view(const MoveRecord& move) {
  MoveView view;
  view.source = true;
  view.kind = move.kind;
  view.in_place = move.source == move.destination;
  view.state = move.state;
  view.here = DomainState::absent;
  view.still_wanted = false;  // the guest is gone with its host: the move cannot go on
  view.aborted = move.abort;
  return view;
}

std::chrono::milliseconds completion_timeout(const ResourceAmounts& resources, double seconds_per_gib) {
  auto amount = [&](const char* name) {
    auto found = resources.find(name);
    return found == resources.end() ? int64_t(0) : found->second;
  };
  const double gib = std::max(1.0, double(amount("MEMORY_MB")) / 1024.0 + double(amount("DISK_GB")));
  return std::chrono::milliseconds(int64_t(gib * seconds_per_gib * 1000.0));
}

result<WorkSpec> resized(WorkSpec work, std::string_view query) {
  auto parsed = parse_placement_query(query);
  if (!parsed) return Error(errc::invalid_argument, parsed.error().message());
  auto amount = [](const ResourceAmounts& amounts, const char* name) {
    auto found = amounts.find(name);
    return found == amounts.end() ? int64_t(0) : found->second;
  };
  const int64_t disk = amount(work.resources, "DISK_GB"), new_disk = amount(parsed->resources, "DISK_GB");
  if (new_disk < disk)
    return Error(errc::invalid_argument,
                 fmt::format("its disk would shrink from {} to {} GB: a disk only grows", disk, new_disk));
  work.query = std::string(query);
  work.resources = std::move(parsed->resources);
  return work;
}

std::string encode(const MoveRecord& move) {
  json::object out{{"instance", move.instance},
                   {"migration", move.migration},
                   {"source", move.source},
                   {"kind", to_string(move.kind)},
                   {"state", to_string(move.state)},
                   {"started_at", move.started_at}};
  if (!move.destination.empty()) out["destination"] = move.destination;
  if (move.abort) out["abort"] = true;
  for (auto [name, value] : {std::pair{"libvirt_uri", &move.libvirt_uri}, std::pair{"migration_uri", &move.migration_uri},
                             std::pair{"domain_xml", &move.domain_xml}, std::pair{"disk", &move.disk},
                             std::pair{"query", &move.query}, std::pair{"error", &move.error}})
    if (!value->empty()) out[name] = *value;
  return json::serialize(out);
}

result<MoveRecord> decode_move(std::string_view text) {
  simdjson::dom::parser parser;
  simdjson::dom::object doc;
  if (parser.parse(text.data(), text.size()).get(doc)) return corrupt("malformed JSON");
  MoveRecord move;
  for (auto [name, field] : {std::pair{"instance", &move.instance}, std::pair{"migration", &move.migration},
                             std::pair{"source", &move.source}, std::pair{"destination", &move.destination}}) {
    std::string_view value;
    auto found = doc[name];
    // A move still preparing has no destination until it claims one.
    if (found.error() == simdjson::NO_SUCH_FIELD && field == &move.destination) continue;
    if (found.get_string().get(value) || !is_uuid(value)) return corrupt(fmt::format("missing or invalid {}", name));
    field->assign(value);
  }
  std::string_view kind, state;
  if (doc["kind"].get_string().get(kind) || !read_enum(kind, kind_names, move.kind))
    return corrupt(fmt::format("unknown kind '{}'", kind));
  if (doc["state"].get_string().get(state) || !read_enum(state, state_names, move.state))
    return corrupt(fmt::format("unknown state '{}'", state));
  if (doc["started_at"].get_int64().get(move.started_at)) return corrupt("missing or invalid started_at");
  if (auto abort = doc["abort"]; abort.error() != simdjson::NO_SUCH_FIELD && abort.get_bool().get(move.abort))
    return corrupt("invalid abort");
  for (auto [name, field] : {std::pair{"libvirt_uri", &move.libvirt_uri}, std::pair{"migration_uri", &move.migration_uri},
                             std::pair{"domain_xml", &move.domain_xml}, std::pair{"disk", &move.disk},
                             std::pair{"query", &move.query}, std::pair{"error", &move.error}}) {
    std::string_view value;
    auto found = doc[name];
    if (found.error() == simdjson::NO_SUCH_FIELD) continue;
    if (found.get_string().get(value)) return corrupt(fmt::format("invalid {}", name));
    field->assign(value);
  }
  if (move.destination.empty() && move.state != MoveState::preparing && move.state != MoveState::reverting)
    return corrupt(fmt::format("{}, but without a destination", to_string(move.state)));
  if (move.state == MoveState::ready && (move.libvirt_uri.empty() || move.migration_uri.empty() || move.domain_xml.empty()))
    return corrupt("ready, but without where the guest goes");
  if (move.kind == MoveKind::resize && move.query.empty()) return corrupt("a resize without its query");
  if (move.kind != MoveKind::live && move.state == MoveState::ready && move.disk.empty())
    return corrupt("ready for a cold move, but without the disk it goes to");
  return move;
}

}  // namespace toyvm
