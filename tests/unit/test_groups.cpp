#include "model/groups.hpp"

#include "catch_result.hpp"

using namespace toyvm;

namespace {
std::vector<Choice> choices_on(std::initializer_list<const char*> hosts) {
  static const Allocations none;
  std::vector<Choice> out;
  for (const char* h : hosts) out.push_back(Choice{h, &none});
  return out;
}
std::vector<std::string> hosts_of(const std::vector<Choice>& choices) {
  std::vector<std::string> out;
  for (auto& c : choices) out.push_back(c.host);
  return out;
}
}  // namespace

TEST_CASE("group policies filter and order the hosts") {
  std::map<std::string, int> members{{"h2", 1}, {"h3", 2}};
  CHECK(hosts_of(filter_for_group(choices_on({"h1", "h2", "h3"}), GroupPolicy::anti_affinity, members)) ==
        std::vector<std::string>{"h1"});
  CHECK(hosts_of(filter_for_group(choices_on({"h1", "h2", "h3"}), GroupPolicy::affinity, members)) ==
        std::vector<std::string>{"h2", "h3"});
  CHECK(hosts_of(filter_for_group(choices_on({"h3", "h2", "h1"}), GroupPolicy::soft_anti_affinity, members)) ==
        std::vector<std::string>{"h1", "h2", "h3"});
  // A new group: affinity allows any host.
  CHECK(filter_for_group(choices_on({"h1", "h2"}), GroupPolicy::affinity, {}).size() == 2);
}

TEST_CASE("the late check makes the later member give way") {
  std::vector<GroupMember> members{{"a", "h1", 10}, {"b", "h1", 12}, {"c", "h2", 11}};
  CHECK(group_allows(GroupPolicy::anti_affinity, members, "a", "h1"));
  CHECK_FALSE(group_allows(GroupPolicy::anti_affinity, members, "b", "h1"));
  CHECK(group_allows(GroupPolicy::anti_affinity, members, "c", "h2"));
  // Affinity: the first member's host is the group's.
  CHECK(group_allows(GroupPolicy::affinity, members, "a", "h1"));
  CHECK(group_allows(GroupPolicy::affinity, members, "b", "h1"));
  CHECK_FALSE(group_allows(GroupPolicy::affinity, members, "c", "h2"));
  CHECK(group_allows(GroupPolicy::soft_anti_affinity, members, "b", "h1"));
  CHECK(group_allows(GroupPolicy::anti_affinity, members, "unknown", "h1"));
}

TEST_CASE("moves count where they head: of two anti-affinity members moving to one host, the later gives way") {
  // a and b move to h3 at once (asked at 20 and 21); c lives on h2.
  std::vector<GroupMember> members{{"a", "h1", 10, "h3", 20}, {"b", "h2", 12, "h3", 21}, {"c", "h2", 11}};
  CHECK(group_allows(GroupPolicy::anti_affinity, members, "a", "h3"));
  CHECK_FALSE(group_allows(GroupPolicy::anti_affinity, members, "b", "h3"));
  // A member scheduled to h3 after a's move was asked gives way to it at its build.
  members.push_back({"d", "h3", 25});
  CHECK_FALSE(group_allows(GroupPolicy::anti_affinity, members, "d", "h3"));
  // One scheduled there before the move was asked keeps its place: the move gives way.
  members.back().revision = 15;
  CHECK(group_allows(GroupPolicy::anti_affinity, members, "d", "h3"));
  CHECK_FALSE(group_allows(GroupPolicy::anti_affinity, members, "a", "h3"));
  // Moving onto the host of a member that is there already: refused.
  CHECK_FALSE(group_allows(GroupPolicy::anti_affinity, {{"a", "h1", 10, "h2", 20}, {"c", "h2", 11}}, "a", "h2"));
  CHECK(group_allows(GroupPolicy::soft_anti_affinity, members, "b", "h3"));
}

TEST_CASE("under affinity a member arrives by a move only where every other member is or heads") {
  std::vector<GroupMember> members{{"a", "h1", 10, "h2", 20}, {"b", "h1", 11}};
  CHECK_FALSE(group_allows(GroupPolicy::affinity, members, "a", "h2"));
  members[1].heading = "h2";
  members[1].heading_revision = 21;
  CHECK(group_allows(GroupPolicy::affinity, members, "a", "h2"));
  CHECK(group_allows(GroupPolicy::affinity, members, "b", "h2"));
  // Alone in its group it goes anywhere.
  CHECK(group_allows(GroupPolicy::affinity, {{"a", "h1", 10, "h2", 20}}, "a", "h2"));
}

TEST_CASE("group member values and policy names round-trip") {
  auto back = decode_group_member(encode_group_member("h1", GroupPolicy::soft_anti_affinity));
  REQUIRE(back);
  CHECK(back->host == "h1");
  CHECK(back->policy == GroupPolicy::soft_anti_affinity);
  CHECK_FALSE(decode_group_member("{}"));
  CHECK_FALSE(decode_group_member(R"({"host":"h","policy":"sometimes"})"));
  CHECK_FALSE(parse_group_policy("affinty"));
}
