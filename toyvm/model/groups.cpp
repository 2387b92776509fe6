#include "model/groups.hpp"

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <simdjson.h>

#include <algorithm>

namespace toyvm {

std::optional<GroupPolicy> parse_group_policy(std::string_view name) {
  if (name == "affinity") return GroupPolicy::affinity;
  if (name == "anti-affinity") return GroupPolicy::anti_affinity;
  if (name == "soft-anti-affinity") return GroupPolicy::soft_anti_affinity;
  return std::nullopt;
}

std::string_view to_string(GroupPolicy policy) noexcept {
  switch (policy) {
    case GroupPolicy::affinity: return "affinity";
    case GroupPolicy::anti_affinity: return "anti-affinity";
    case GroupPolicy::soft_anti_affinity: return "soft-anti-affinity";
  }
  return "";
}

std::string encode_group_member(const std::string& host, GroupPolicy policy) {
  return boost::json::serialize(boost::json::object{{"host", host}, {"policy", to_string(policy)}});
}

std::optional<GroupMemberValue> decode_group_member(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  std::string_view host, policy;
  if (parser.parse(json.data(), json.size()).get(doc) || doc["host"].get_string().get(host) ||
      doc["policy"].get_string().get(policy))
    return std::nullopt;
  auto parsed = parse_group_policy(policy);
  if (!parsed) return std::nullopt;
  return GroupMemberValue{std::string(host), *parsed};
}

std::vector<Choice> filter_for_group(std::vector<Choice> choices, GroupPolicy policy,
                                     const std::map<std::string, int>& members_per_host) {
  auto members_on = [&](const Choice& c) {
    auto it = members_per_host.find(c.host);
    return it == members_per_host.end() ? 0 : it->second;
  };
  switch (policy) {
    case GroupPolicy::anti_affinity:
      std::erase_if(choices, [&](const Choice& c) { return members_on(c) > 0; });
      break;
    case GroupPolicy::affinity:
      if (!members_per_host.empty()) std::erase_if(choices, [&](const Choice& c) { return members_on(c) == 0; });
      break;
    case GroupPolicy::soft_anti_affinity:
      std::stable_sort(choices.begin(), choices.end(),
                       [&](const Choice& a, const Choice& b) { return members_on(a) < members_on(b); });
      break;
  }
  return choices;
}

bool group_allows(GroupPolicy policy, const std::vector<GroupMember>& members, const std::string& instance,
                  const std::string& host) {
  auto self = std::find_if(members.begin(), members.end(), [&](const GroupMember& m) { return m.instance == instance; });
  if (self == members.end()) return true;  // not a member (yet): nothing to check against
  const bool arriving = self->heading == host && self->host != host;
  const int64_t since = arriving ? self->heading_revision : self->revision;
  // Came before this one, to `host`: settled there, or on its way by a move. Ties cannot happen
  // (one revision per transaction) but the instance uuid breaks them anyway.
  auto before = [&](int64_t revision, const GroupMember& m) {
    return revision < since || (revision == since && m.instance < instance);
  };
  auto earlier_on_host = [&](const GroupMember& m) {
    if (m.instance == instance) return false;
    return (m.host == host && before(m.revision, m)) || (m.heading == host && before(m.heading_revision, m));
  };
  switch (policy) {
    case GroupPolicy::anti_affinity: return std::none_of(members.begin(), members.end(), earlier_on_host);
    case GroupPolicy::affinity: {
      if (arriving)
        return std::all_of(members.begin(), members.end(), [&](const GroupMember& m) {
          return m.instance == instance || m.host == host || m.heading == host;
        });
      // The group lives where its first member is.
      auto first = std::min_element(members.begin(), members.end(), [](const GroupMember& a, const GroupMember& b) {
        return a.revision < b.revision ||
               (a.revision == b.revision && a.instance < b.instance);
      });
      return first->host == host;
    }
    case GroupPolicy::soft_anti_affinity:
      return true;
  }
  return true;
}

}  // namespace toyvm
