#include "model/audit.hpp"

#include "catch_result.hpp"

#include <algorithm>

using namespace toyvm;

namespace {

const std::string host_a = "aaaaaaaa-0000-4000-8000-000000000000";
const std::string host_b = "bbbbbbbb-0000-4000-8000-000000000000";

InstanceRecord record(const std::string& uuid, const std::string& host, InstanceState state) {
  InstanceRecord r;
  r.uuid = uuid;
  r.host = host;
  r.state = state;
  return r;
}

// Two live hosts, one ACTIVE instance on each: everything agrees.
AuditSnapshot consistent() {
  AuditSnapshot s;
  s.providers = {host_a, host_b};
  s.live_hosts = {host_a, host_b};
  for (auto [uuid, host] : {std::pair{"i-1", host_a}, std::pair{"i-2", host_b}}) {
    s.allocations[uuid] = Allocations{{host, {{"VCPU", 1}}}};
    s.work_host[uuid] = host;
    s.instances[uuid] = record(uuid, host, InstanceState::active);
    s.domains[host].insert(uuid);
  }
  s.group_members["i-1"] = "web";
  return s;
}

std::vector<AuditKind> kinds(const AuditSnapshot& s) {
  std::vector<AuditKind> out;
  for (const Discrepancy& d : find_discrepancies(s)) out.push_back(d.kind);
  return out;
}

}  // namespace

TEST_CASE("a consistent snapshot has no discrepancy") { CHECK(find_discrepancies(consistent()).empty()); }

TEST_CASE("every kind of disagreement is named") {
  using K = AuditKind;
  AuditSnapshot s = consistent();
  SECTION("an allocation of toyvm's that no instance owns; another service's is not toyvm's to judge") {
    s.allocations["ghost"] = Allocations{{host_a, {{"VCPU", 2}}}};
    s.consumers["ghost"].owner.project = "toyvm";
    s.allocations["nova-server"] = Allocations{{"cccccccc-0000-4000-8000-000000000000", {{"VCPU", 4}}}};
    s.consumers["nova-server"].owner.project = "3f1c0a";
    s.allocations["another-toyvm"] = Allocations{{host_b, {{"VCPU", 1}}}};
    s.consumers["another-toyvm"].owner.project = "toyvm-east";
    s.allocations["east-project"] = Allocations{{host_b, {{"VCPU", 1}}}};
    s.consumers["east-project"].owner.project = "toyvm-east:team-a";
    CHECK(kinds(s) == std::vector<K>{K::allocation_without_instance});
    s.own_project = "toyvm-east";  // its projects' consumers are its own too
    auto found = find_discrepancies(s);
    REQUIRE(found.size() == 2);
    CHECK(found[0].instance == "another-toyvm");
    CHECK(found[1].instance == "east-project");
  }
  SECTION("a claim a running schedule holds is on its way, not a leak") {
    s.allocations["claimed"] = Allocations{{host_a, {{"VCPU", 1}}}};
    s.consumers["claimed"].owner.project = "toyvm";
    s.claiming.insert("claimed");
    CHECK(kinds(s).empty());
    s.claiming.clear();  // the schedule is gone: nothing can hand it over any more
    CHECK(kinds(s) == std::vector<K>{K::allocation_without_instance});
    s.lapsed_holds["claimed"] = LapsedHold{42, "claimed", 40};  // its hold, past its deadline, goes with the claim's fix
    CHECK(kinds(s) == std::vector<K>{K::allocation_without_instance});
  }
  SECTION("a hold whose schedule is gone before it claimed anything") {
    s.lapsed_holds["never-claimed"] = LapsedHold{42, std::nullopt, 0};
    auto found = find_discrepancies(s);
    REQUIRE(found.size() == 1);
    CHECK(found[0].kind == K::hold_lapsed);
    CHECK(found[0].instance == "never-claimed");
    CHECK(fixable(K::hold_lapsed));
  }
  SECTION("a schedule's hold key past its deadline, after its claims' fixes") {
    s.allocations["claimed"] = Allocations{{host_a, {{"VCPU", 1}}}};
    s.consumers["claimed"].owner.project = "toyvm";
    s.lapsed_holds["claimed"] = LapsedHold{42, "first", 40};
    s.lapsed_holds["first"] = LapsedHold{41, "first", 40};
    s.lapsed_schedule_holds["first"] = 40;
    CHECK(kinds(s) == std::vector<K>{K::allocation_without_instance, K::hold_lapsed, K::schedule_hold_lapsed});
    CHECK(find_discrepancies(s).back().instance == "first");
    CHECK(fixable(K::schedule_hold_lapsed));
  }
  SECTION("an instance that holds nothing, and one held elsewhere") {
    s.allocations.erase("i-1");
    s.allocations["i-2"] = Allocations{{host_a, {{"VCPU", 1}}}};
    CHECK(kinds(s) == std::vector<K>{K::instance_without_allocation, K::allocation_elsewhere});
  }
  SECTION("work on a dead host and on a provider Placement does not know") {
    s.live_hosts.erase(host_b);
    s.domains.erase(host_b);
    s.work_host["i-3"] = "cccccccc-0000-4000-8000-000000000000";
    s.instances["i-3"] = record("i-3", s.work_host["i-3"], InstanceState::scheduled);
    s.allocations["i-3"] = Allocations{{s.work_host["i-3"], {{"VCPU", 1}}}};
    CHECK(kinds(s) == std::vector<K>{K::work_on_dead_host, K::work_on_unknown_provider});
  }
  SECTION("ERROR holds nothing once given back; while releasing it may") {
    s.instances["i-1"].state = InstanceState::error;
    s.domains[host_a].clear();
    CHECK(kinds(s) == std::vector<K>{K::error_holding_allocation});
    s.instances["i-1"].releasing = true;
    CHECK(kinds(s).empty());
    s.allocations.erase("i-1");
    s.instances["i-1"].releasing = false;
    CHECK(kinds(s).empty());
  }
  SECTION("a domain without work, a member and a record without an instance") {
    s.domains[host_b].insert("i-1");  // i-1's work is on host_a
    s.group_members["gone"] = "web";
    s.instances["old"] = record("old", host_a, InstanceState::active);
    CHECK(kinds(s) == std::vector<K>{K::record_without_work, K::domain_without_work, K::member_without_instance});
  }
  SECTION("an ACTIVE or STOPPED instance whose live host reports no domain for it") {
    s.domains[host_a].erase("i-1");
    CHECK(kinds(s) == std::vector<K>{K::instance_without_domain});
    s.instances["i-1"].state = InstanceState::stopped;
    CHECK(kinds(s) == std::vector<K>{K::instance_without_domain});
    // Not yet made, or its host is dead (then it says work_on_dead_host): nothing to expect.
    s.instances["i-1"].state = InstanceState::building;
    CHECK(kinds(s).empty());
    s.instances["i-2"].state = InstanceState::active;
    s.domains.erase(host_b);
    s.live_hosts.erase(host_b);
    CHECK(kinds(s) == std::vector<K>{K::work_on_dead_host});
  }
  SECTION("a value nobody can read is its own kind, and never taken for a missing one") {
    s.unreadable.push_back({"i-1", "/toyvm/v1/work/a/i-1", "invalid power"});
    auto found = find_discrepancies(s);
    REQUIRE(found.size() == 1);
    CHECK(found[0].kind == K::unreadable_value);
    CHECK(found[0].instance == "i-1");
    CHECK_THAT(found[0].detail, Catch::Contains("/toyvm/v1/work/a/i-1") && Catch::Contains("invalid power"));
  }
  for (const Discrepancy& d : find_discrepancies(s)) CHECK_FALSE(to_string(d.kind).empty());
}

TEST_CASE("a schedule's hold stands until its deadline has passed by more than the clocks may differ") {
  const int64_t until = 1'000'000;
  const std::string hold = encode_hold(until);
  CHECK_FALSE(hold_lapsed(hold, until - 1));
  CHECK_FALSE(hold_lapsed(hold, until + hold_clock_margin_ms));
  CHECK(hold_lapsed(hold, until + hold_clock_margin_ms + 1));
  // Under a lease (the scheduler service's): the lease ends it, never a deadline.
  CHECK_FALSE(hold_lapsed("", until * 1000));
  // Unknown is not absent: a value this toyvm cannot read stands.
  CHECK_FALSE(hold_lapsed("soon", until * 1000));
  CHECK_FALSE(hold_lapsed("12x", until * 1000));
}

TEST_CASE("only unambiguous repairs are fixable") {
  CHECK(fixable(AuditKind::allocation_without_instance));
  CHECK(fixable(AuditKind::error_holding_allocation));
  CHECK(fixable(AuditKind::member_without_instance));
  CHECK_FALSE(fixable(AuditKind::instance_without_allocation));
  CHECK_FALSE(fixable(AuditKind::allocation_elsewhere));
  CHECK_FALSE(fixable(AuditKind::domain_without_work));
  CHECK_FALSE(fixable(AuditKind::instance_without_domain));
  CHECK_FALSE(fixable(AuditKind::unreadable_value));
}

TEST_CASE("a move in flight: its migration consumer holds the source, the instance its destination") {
  using K = AuditKind;
  AuditSnapshot s = consistent();
  // i-1 moves from host_a to host_b: its work is still on host_a.
  const std::string migration = "11111111-2222-4333-8444-555555555555";
  s.allocations[migration] = Allocations{{host_a, {{"VCPU", 1}}}};
  s.consumers[migration].owner.project = "toyvm";
  s.allocations["i-1"] = Allocations{{host_b, {{"VCPU", 1}}}};
  const MoveRecord moving{
      .instance = "i-1", .migration = migration, .source = host_a, .destination = host_b, .state = MoveState::claimed};
  SECTION("with its move record, the books are as they should be") {
    s.moves["i-1"] = moving;
    CHECK(find_discrepancies(s).empty());
    // The guest runs on its destination before its work follows: no domain is missing or stray.
    s.domains[host_a].erase("i-1");
    s.domains[host_b].insert("i-1");
    CHECK(find_discrepancies(s).empty());
  }
  SECTION("a move still preparing may have moved its books before its record names the destination") {
    MoveRecord preparing = moving;
    preparing.destination.clear();
    preparing.state = MoveState::preparing;
    s.moves["i-1"] = preparing;
    CHECK(find_discrepancies(s).empty());
  }
  SECTION("a move past its deadline is overdue; a young one is not") {
    MoveRecord old = moving;
    old.started_at = 1'000'000;
    s.moves["i-1"] = old;
    s.now_ms = old.started_at + 7'200'000;
    s.move_deadline_ms = 3'600'000;
    CHECK(kinds(s) == std::vector<K>{K::move_overdue});
    s.now_ms = old.started_at + 60'000;
    CHECK(find_discrepancies(s).empty());
  }
  SECTION("a guest in neither live host's domains while it moves is named; a dead host's are unknown") {
    s.moves["i-1"] = moving;
    s.domains[host_a].erase("i-1");
    CHECK(kinds(s) == std::vector<K>{K::move_without_domain});
    s.live_hosts.erase(host_b);
    const std::vector<K> found = kinds(s);
    CHECK(std::find(found.begin(), found.end(), K::move_without_domain) == found.end());
  }
  SECTION("a domain for it on a third host is stray, move or not") {
    s.moves["i-1"] = moving;
    s.providers.insert("c0ffee00-0000-4000-8000-000000000003");
    s.domains["c0ffee00-0000-4000-8000-000000000003"].insert("i-1");
    CHECK(kinds(s) == std::vector<K>{K::domain_without_work});
  }
  SECTION("without one, the migration consumer is nobody's and the instance holds another host") {
    CHECK(kinds(s) == std::vector<K>{K::allocation_without_instance, K::allocation_elsewhere});
  }
  SECTION("with a move record that cannot be read, no consumer is judged to be nobody's") {
    s.moves_unreadable = true;
    CHECK(kinds(s) == std::vector<K>{K::allocation_elsewhere});
  }
}

TEST_CASE("claims are sorted by the hold they name, as read together") {
  AuditSnapshot s;
  s.now_ms = 1'000'000;
  const std::string standing = encode_hold(s.now_ms + 5'000), past = encode_hold(s.now_ms - hold_clock_margin_ms - 1);
  std::map<std::string, KeyRead> holds{{"live", {standing, 10}}, {"dead", {past, 11}}, {"garbled", {"{", 12}}};
  std::map<std::string, KeyRead> claims{
      {"a", {encode_hold_name("live"), 20}},     // its schedule renews the hold
      {"b", {encode_hold_name("dead"), 21}},     // its schedule is gone
      {"c", {encode_hold_name("gone"), 22}},     // its schedule let go of the hold, or an audit took it
      {"d", {encode_hold_name("garbled"), 23}},  // a deadline that cannot be read stands
      {"e", {"", 24}},                           // under a lease
      {"f", {past, 25}},                         // an older schedule's own deadline, past
      {"g", {standing, 26}},                     // and one still standing
  };
  sort_holds(s, claims, holds);
  CHECK(s.claiming == std::set<std::string>{"a", "d", "e", "g"});
  CHECK(s.lapsed_holds == std::map<std::string, LapsedHold>{{"b", LapsedHold{21, "dead", 11}},
                                                             {"c", LapsedHold{22, "gone", 0}},
                                                             {"f", LapsedHold{25, std::nullopt, 0}}});
  CHECK(s.lapsed_schedule_holds == std::map<std::string, int64_t>{{"dead", 11}});
}

TEST_CASE("a claim's value names its schedule's hold, or none") {
  CHECK(named_hold(encode_hold_name("i-1")) == std::optional<std::string_view>("i-1"));
  CHECK_FALSE(named_hold(encode_hold(1234)));
  CHECK_FALSE(named_hold(""));
  CHECK_FALSE(named_hold("hold "));
}
