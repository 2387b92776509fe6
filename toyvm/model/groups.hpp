#pragma once
// Server groups (Nova's affinity policies), decided from the group's members in etcd. Pure.

#include "model/candidates.hpp"

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toyvm {

enum class GroupPolicy { affinity, anti_affinity, soft_anti_affinity };

std::optional<GroupPolicy> parse_group_policy(std::string_view name);
std::string_view to_string(GroupPolicy policy) noexcept;

struct GroupMember {
  std::string instance;
  std::string host;
  int64_t revision = 0;  // when the member key was created, or last moved to another host
  // A move of it in flight that has claimed a host (and is not being undone): it counts there
  // too, from when the move was asked (its record's create revision). Membership itself
  // moves only when the move switches over.
  std::string heading{};
  int64_t heading_revision = 0;
};

// The value of a group member key: {"host": ..., "policy": ...}.
std::string encode_group_member(const std::string& host, GroupPolicy policy);
struct GroupMemberValue {
  std::string host;
  GroupPolicy policy = GroupPolicy::anti_affinity;
};
std::optional<GroupMemberValue> decode_group_member(std::string_view json);

// Keeps the choices the policy allows, in order; soft anti-affinity reorders by how many
// members each host already has (fewest first) and drops nothing.
std::vector<Choice> filter_for_group(std::vector<Choice> choices, GroupPolicy policy,
                                     const std::map<std::string, int>& members_per_host);

// The compute agent's late check before it builds `instance` on `host`, or prepares for it to
// arrive there by a move (its member's `heading` is `host`): under concurrent schedules and
// moves two members may have been placed against the policy; the one that came later (created,
// or its move asked) gives way. Returns false when `instance` must not be built or arrive here.
// A member moving under affinity arrives only where every other member is (or is heading).
bool group_allows(GroupPolicy policy, const std::vector<GroupMember>& members, const std::string& instance,
                  const std::string& host);

}  // namespace toyvm
