#include "model/audit.hpp"

#include <fmt/format.h>

namespace toyvm {

std::string_view to_string(AuditKind kind) noexcept {
  switch (kind) {
    case AuditKind::allocation_without_instance: return "allocation_without_instance";
    case AuditKind::instance_without_allocation: return "instance_without_allocation";
    case AuditKind::allocation_elsewhere: return "allocation_elsewhere";
    case AuditKind::work_on_unknown_provider: return "work_on_unknown_provider";
    case AuditKind::work_on_dead_host: return "work_on_dead_host";
    case AuditKind::error_holding_allocation: return "error_holding_allocation";
    case AuditKind::domain_without_work: return "domain_without_work";
    case AuditKind::member_without_instance: return "member_without_instance";
    case AuditKind::record_without_work: return "record_without_work";
    case AuditKind::instance_without_domain: return "instance_without_domain";
    case AuditKind::unreadable_value: return "unreadable_value";
    case AuditKind::move_overdue: return "move_overdue";
    case AuditKind::move_without_domain: return "move_without_domain";
    case AuditKind::hold_lapsed: return "hold_lapsed";
    case AuditKind::schedule_hold_lapsed: return "schedule_hold_lapsed";
  }
  return "unknown";
}

bool fixable(AuditKind kind) noexcept {
  return kind == AuditKind::allocation_without_instance || kind == AuditKind::error_holding_allocation ||
         kind == AuditKind::member_without_instance || kind == AuditKind::hold_lapsed ||
         kind == AuditKind::schedule_hold_lapsed;
}

void sort_holds(AuditSnapshot& s, const std::map<std::string, KeyRead>& claims,
                const std::map<std::string, KeyRead>& holds) {
  for (auto& [first, hold] : holds)
    if (hold_lapsed(hold.value, s.now_ms)) s.lapsed_schedule_holds[first] = hold.revision;
  for (auto& [uuid, claim] : claims) {
    auto name = named_hold(claim.value);
    if (!name) {
      if (hold_lapsed(claim.value, s.now_ms)) {
        s.lapsed_holds[uuid] = LapsedHold{claim.revision, std::nullopt, 0};
      } else {
        s.claiming.insert(uuid);
      }
      continue;
    }
    auto hold = holds.find(std::string(*name));
    if (hold == holds.end()) {
      s.lapsed_holds[uuid] = LapsedHold{claim.revision, std::string(*name), 0};
    } else if (hold_lapsed(hold->second.value, s.now_ms)) {
      s.lapsed_holds[uuid] = LapsedHold{claim.revision, std::string(*name), hold->second.revision};
    } else {
      s.claiming.insert(uuid);
    }
  }
}

std::vector<Discrepancy> find_discrepancies(const AuditSnapshot& s) {
  std::vector<Discrepancy> found;
  auto add = [&](AuditKind kind, const std::string& instance, const std::string& provider, std::string detail) {
    found.push_back(Discrepancy{kind, instance, provider, std::move(detail)});
  };
  auto providers_of = [](const Allocations& allocations) {
    std::string text;
    for (auto& [rp, amounts] : allocations) text += (text.empty() ? "" : ",") + rp;
    return text;
  };

  std::set<std::string> migrations;  // the consumers holding a moving instance's source share
  for (auto& [uuid, move] : s.moves) migrations.insert(move.migration);
  for (auto& [consumer, allocations] : s.allocations) {
    // Unknown is not absent: with a move record that cannot be read, no consumer is judged.
    if (allocations.empty() || migrations.count(consumer) || s.moves_unreadable) continue;
    auto read = s.consumers.find(consumer);
    const bool ours = read != s.consumers.end() && is_own_placement_project(s.own_project, read->second.owner.project);
    // A running schedule's claim is on its way to becoming an instance.
    if (ours && !s.instances.count(consumer) && !s.work_host.count(consumer) && !s.claiming.count(consumer))
      add(AuditKind::allocation_without_instance, consumer, providers_of(allocations),
          "resources held by a consumer that is no instance");
  }
  // A hold whose schedule is gone; one over a claim goes with the claim's fix.
  for (auto& [uuid, hold] : s.lapsed_holds) {
    auto held = s.allocations.find(uuid);
    if (held == s.allocations.end() || held->second.empty())
      add(AuditKind::hold_lapsed, uuid, "", "a schedule's hold past its deadline: the schedule is gone");
  }
  // After the claims' fixes, which are guarded by it as read.
  for (auto& [first, revision] : s.lapsed_schedule_holds)
    add(AuditKind::schedule_hold_lapsed, first, "", "a schedule's hold key past its deadline: the schedule is gone");

  for (auto& [uuid, host] : s.work_host) {
    if (!s.providers.count(host)) {
      add(AuditKind::work_on_unknown_provider, uuid, host, "its host is no provider in Placement");
    } else if (!s.live_hosts.count(host)) {
      add(AuditKind::work_on_dead_host, uuid, host, "its host's agent is not alive");
    }
    auto record = s.instances.find(uuid);
    const bool error = record != s.instances.end() && record->second.state == InstanceState::error;
    const bool deleting = record != s.instances.end() && record->second.state == InstanceState::deleting;
    auto held = s.allocations.find(uuid);
    const bool holds = held != s.allocations.end() && !held->second.empty();
    if (error) {
      if (holds && !record->second.releasing)
        add(AuditKind::error_holding_allocation, uuid, providers_of(held->second), "ERROR, yet it holds resources");
      continue;
    }
    if (!holds) {
      if (!deleting) add(AuditKind::instance_without_allocation, uuid, host, "it holds no resources in Placement");
      continue;
    }
    // While it moves, it holds its destination (its source's share is its migration's); a move
    // still preparing may have moved its books before its record names where.
    auto move = s.moves.find(uuid);
    const bool moving = move != s.moves.end() &&
                        (move->second.destination.empty() || held->second.count(move->second.destination));
    if (!held->second.count(host) && !moving)
      add(AuditKind::allocation_elsewhere, uuid, providers_of(held->second),
          fmt::format("its work is on {}", host));
  }

  for (auto& [uuid, record] : s.instances) {
    auto work = s.work_host.find(uuid);
    if (work == s.work_host.end()) {
      add(AuditKind::record_without_work, uuid, record.host, "no host has work for it");
      continue;
    }
    // Its host is alive and says what domains it has: a guest that should be there is missing.
    const bool made = record.state == InstanceState::active || record.state == InstanceState::stopped;
    const std::string& host = work->second;
    auto listed = s.domains.find(host);
    // A guest that moves has its domain on one host or the other until its work follows it.
    if (made && record.host == host && s.live_hosts.count(host) && !s.moves.count(uuid) &&
        (listed == s.domains.end() || !listed->second.count(uuid)))
      add(AuditKind::instance_without_domain, uuid, host,
          fmt::format("{}, yet its host reports no domain for it", to_string(record.state)));
  }

  // A move hides what a guest between two hosts looks like for a while, not for good.
  auto reports = [&](const std::string& host, const std::string& uuid) {
    auto listed = s.domains.find(host);
    return listed != s.domains.end() && listed->second.count(uuid);
  };
  for (auto& [uuid, move] : s.moves) {
    if (s.move_deadline_ms > 0 && s.now_ms - move.started_at > s.move_deadline_ms)
      add(AuditKind::move_overdue, uuid, move.source,
          fmt::format("{} move to {} {}, started {} s ago", to_string(move.kind),
                      move.destination.empty() ? "(not chosen)" : move.destination, to_string(move.state),
                      (s.now_ms - move.started_at) / 1000));
    auto record = s.instances.find(uuid);
    const bool made = record != s.instances.end() && (record->second.state == InstanceState::active ||
                                                       record->second.state == InstanceState::stopped);
    // Only hosts whose agents are alive say what they have; a dead one's domains are unknown.
    const bool both_live = s.live_hosts.count(move.source) &&
                           (move.destination.empty() || s.live_hosts.count(move.destination));
    if (made && both_live && !reports(move.source, uuid) && (move.destination.empty() || !reports(move.destination, uuid)))
      add(AuditKind::move_without_domain, uuid, move.source,
          fmt::format("{} and moving, yet neither {}{}{} reports a domain for it", to_string(record->second.state),
                      move.source, move.destination.empty() ? "" : " nor ", move.destination));
  }

  for (const UnreadableValue& value : s.unreadable)
    add(AuditKind::unreadable_value, value.instance, "", fmt::format("{}: {}", value.key, value.why));

  for (auto& [provider, uuids] : s.domains) {
    for (const std::string& uuid : uuids) {
      auto work = s.work_host.find(uuid);
      auto move = s.moves.find(uuid);
      const bool arriving = move != s.moves.end() && move->second.destination == provider;
      if ((work == s.work_host.end() || work->second != provider) && !arriving)
        add(AuditKind::domain_without_work, uuid, provider, "a domain its host has no work for");
    }
  }

  for (auto& [uuid, group] : s.group_members) {
    if (!s.work_host.count(uuid) && !s.instances.count(uuid))
      add(AuditKind::member_without_instance, uuid, "", fmt::format("member of server group {}", group));
  }
  return found;
}

}  // namespace toyvm
