#include "model/access.hpp"
#include "model/projects.hpp"
#include "model/records.hpp"
#include "model/requests.hpp"
#include "model/uuid.hpp"
#include "services/quota.hpp"

#include <algorithm>

#include "catch_result.hpp"

using namespace toyvm;

TEST_CASE("project names are safe key segments and Placement ids") {
  for (const char* good : {"a", "team-a", "default", "p0_1", "0abc", "abcdefghijklmnopqrstuvwxyz012345"})
    CHECK(is_project_name(good));
  for (const char* bad : {"", "-a", "_a", "Team", "a/b", "a.b", "..", "a b", "abcdefghijklmnopqrstuvwxyz0123456", "é"})
    CHECK_FALSE(is_project_name(bad));
}

TEST_CASE("the default project keeps the Placement id toyvm's claims always had") {
  CHECK(placement_project_id("toyvm", "default") == "toyvm");
  CHECK(placement_project_id("toyvm", "team-a") == "toyvm:team-a");
  CHECK(is_own_placement_project("toyvm", "toyvm"));
  CHECK(is_own_placement_project("toyvm", "toyvm:team-a"));
  CHECK_FALSE(is_own_placement_project("toyvm", "toyvm-east"));
  CHECK_FALSE(is_own_placement_project("toyvm", "toyvm-east:team-a"));
  CHECK_FALSE(is_own_placement_project("toyvm", "toyvm:"));
  CHECK_FALSE(is_own_placement_project("toyvm", "toyvm:Bad/Name"));
  CHECK_FALSE(is_own_placement_project("toyvm", "6b3c9a7e0e5d4c4f9d1a2b3c4d5e6f70"));
}

TEST_CASE("limits are set as NAME=N, unlimited or default") {
  auto twenty = parse_limit_setting("VCPU=20");
  REQUIRE(twenty);
  CHECK(twenty->name == "VCPU");
  CHECK(twenty->value == 20);
  CHECK(parse_limit_setting("instances=unlimited")->value == unlimited);
  CHECK_FALSE(parse_limit_setting("CUSTOM_GPU=default")->value.has_value());
  CHECK(parse_limit_setting("instances=0")->value == 0);
  for (const char* bad : {"VCPU", "VCPU=", "VCPU=-1", "VCPU=2x", "vcpu=2", "=2", "VCPU=99999999999999999999"})
    CHECK_FALSE(parse_limit_setting(bad));
  CHECK(parse_limit_setting("VCPU=x").error() == errc::invalid_argument);
}

TEST_CASE("a project's own limits go over the defaults") {
  const Limits defaults{{"VCPU", 20}, {"instances", 10}};
  const Limits own{{"VCPU", unlimited}, {"MEMORY_MB", 4096}};
  CHECK(effective_limits(defaults, own) == Limits{{"VCPU", unlimited}, {"instances", 10}, {"MEMORY_MB", 4096}});
  CHECK(effective_limits(defaults, {}) == defaults);
}

TEST_CASE("a request over quota is told in numbers, one line per limit passed") {
  const Limits limits{{"VCPU", 20}, {"instances", 5}, {"MEMORY_MB", unlimited}};
  const ProjectUsage used{4, {{"VCPU", 18}, {"MEMORY_MB", 9000}}};
  CHECK(over_quota(limits, used, ProjectUsage{1, {{"VCPU", 2}, {"MEMORY_MB", 100000}}}).empty());  // to the edge
  CHECK(over_quota(limits, used, ProjectUsage{1, {{"VCPU", 4}}}) ==
        std::vector<std::string>{"VCPU: 18 used + 4 asked > 20"});
  CHECK(over_quota(limits, used, ProjectUsage{2, {{"VCPU", 4}, {"DISK_GB", 50}}}) ==
        std::vector<std::string>{"instances: 4 used + 2 asked > 5", "VCPU: 18 used + 4 asked > 20"});
  // A limit set below what is used already refuses more, and nothing else.
  const Limits lowered{{"VCPU", 10}};
  CHECK(over_quota(lowered, used, ProjectUsage{1, {{"VCPU", 1}}}).size() == 1);
  CHECK(over_quota(lowered, used, ProjectUsage{1, {{"MEMORY_MB", 1}}}).empty());
  // After claiming, the use counts the asked claims: as before them, the same answer.
  const ProjectUsage asked{1, {{"VCPU", 4}}};
  const ProjectUsage after{5, {{"VCPU", 22}, {"MEMORY_MB", 9000}}};
  CHECK(without(after, asked) == ProjectUsage{4, {{"VCPU", 18}, {"MEMORY_MB", 9000}}});
  CHECK(over_quota(limits, without(after, asked), asked) == std::vector<std::string>{"VCPU: 18 used + 4 asked > 20"});
}

TEST_CASE("Placement's usages of all a project's consumers are its use; its moves are in a project apart") {
  auto used = parse_project_usage(R"({"usages": {"all": {"consumer_count": 3, "VCPU": 6, "MEMORY_MB": 768}}})");
  REQUIRE(used);
  CHECK(*used == ProjectUsage{3, {{"VCPU", 6}, {"MEMORY_MB", 768}}});
  CHECK(*parse_project_usage(R"({"usages": {}})") == ProjectUsage{});
  CHECK_FALSE(parse_project_usage("{}"));
  CHECK_FALSE(parse_project_usage(R"({"usages": {"all": {"VCPU": "six"}}})"));

  const std::string team = placement_project_id("toyvm", "team-a");
  CHECK(moving_project_id(team) == "toyvm:team-a/moving");
  CHECK(instance_project_id(moving_project_id(team)) == team);
  CHECK(instance_project_id(team) == team);  // a migration consumer made before the mark
  CHECK(is_own_placement_project("toyvm", moving_project_id(team)));
  CHECK(is_own_placement_project("toyvm", moving_project_id("toyvm")));
  CHECK_FALSE(is_own_placement_project("toyvm", moving_project_id("nova")));
  CHECK_FALSE(is_own_placement_project("toyvm", "toyvm:team-a/moving/moving"));
}

TEST_CASE("project records and limits survive a round trip; values a reader cannot judge are refused") {
  ProjectRecord p{1700000000, true};
  CHECK(*decode_project(encode(p)) == p);
  const Limits limits{{"VCPU", 20}, {"instances", unlimited}};
  CHECK(*decode_limits(encode_limits(limits)) == limits);
  CHECK_FALSE(decode_limits(R"({"limits": {"VCPU": -2}})"));
  CHECK_FALSE(decode_limits(R"({"limits": {"vcpu": 2}})"));
  CHECK_FALSE(decode_limits(R"({"limits": {"VCPU": "20"}})"));
}

TEST_CASE("work and records written before projects are the default project's") {
  auto work = decode_work(R"({"uuid":"7387cdc8-291c-4b02-87ce-895f460b7a80","power":"running"})");
  REQUIRE(work);
  CHECK(work->project == "default");
  CHECK(work->user.empty());
  CHECK(owner_of(*work, "toyvm", "toyvm") == ConsumerOwner{"toyvm", "toyvm"});
  work->project = "team-a";
  work->user = "alice";
  CHECK(owner_of(*work, "toyvm", "toyvm") == ConsumerOwner{"toyvm:team-a", "alice"});
  auto record = decode_instance(R"({"uuid":"7387cdc8-291c-4b02-87ce-895f460b7a80","state":"ACTIVE"})");
  REQUIRE(record);
  CHECK(record->project == "default");
  // A project name no reader could use is an unreadable value, not the default project.
  CHECK_FALSE(decode_work(R"({"uuid":"7387cdc8-291c-4b02-87ce-895f460b7a80","project":"../x"})"));
  CHECK_FALSE(decode_instance(R"({"uuid":"7387cdc8-291c-4b02-87ce-895f460b7a80","project":""})"));
}

TEST_CASE("a project's etcd roles grant its own ranges only, each ending in '/'") {
  KeyLayout keys("/t/v1");
  CHECK(etcd_role_name(keys, "team-a", ProjectRole::member) == "/t/v1:team-a:member");
  CHECK(parse_etcd_role(keys, "/t/v1:team-a:reader") == ProjectMembership{"team-a", ProjectRole::reader});
  for (const char* other : {"root", "/other:team-a:member", "/t/v1:team-a:admin", "/t/v1:Bad:member", "/t/v1:team-a"})
    CHECK_FALSE(parse_etcd_role(keys, other));
  const auto member = project_grants(keys, "team", ProjectRole::member);
  const auto reader = project_grants(keys, "team", ProjectRole::reader);
  CHECK(reader.size() == 6);
  CHECK(member.size() == 8);
  for (const KeyGrant& grant : member) {
    if (grant.range_end.empty()) continue;  // one key: its record, its quota, the defaults
    CHECK(grant.key.ends_with("/team/"));
    CHECK(grant.range_end == prefix_range_end(grant.key));
    // "team" is a prefix of "team-a": its ranges do not reach team-a's keys.
    CHECK_FALSE((keys.project_instance("team-a", "x") >= grant.key && keys.project_instance("team-a", "x") < grant.range_end));
    CHECK_FALSE((keys.request("team-a", "x") >= grant.key && keys.request("team-a", "x") < grant.range_end));
  }
  // A reader writes only its console requests; a member its requests and replies too.
  CHECK(std::count_if(reader.begin(), reader.end(), [](const KeyGrant& g) { return g.write; }) == 1);
  CHECK(std::count_if(member.begin(), member.end(), [](const KeyGrant& g) { return g.write; }) == 3);
  // Nothing of the cloud's: no work, record, host, move or Placement's claims.
  for (const KeyGrant& grant : member)
    for (const std::string& key : {keys.work("rp", "x"), keys.instance("x"), keys.host("rp"), keys.move("x"),
                                   keys.claim("x"), keys.scheduler_leader()})
      CHECK_FALSE((key >= grant.key && (grant.range_end.empty() ? key == grant.key : key < grant.range_end)));
}

TEST_CASE("project requests and replies survive a round trip; one that cannot be read is refused") {
  ProjectRequest schedule;
  schedule.user = "alice";
  schedule.query = "resources=VCPU:1";
  schedule.count = 3;
  schedule.name = "web";
  schedule.group = "g";
  schedule.group_policy = "affinity";
  schedule.user_data = std::string("#cloud-config\n\0\xff", 16);
  schedule.keys = {{"alice", "ssh-ed25519 AAAA"}};
  schedule.config_drive = true;
  schedule.asked_at = 42;
  CHECK(*decode_request(encode(schedule)) == schedule);
  ProjectRequest stop;
  stop.action = RequestAction::stop;
  stop.instance = "7387cdc8-291c-4b02-87ce-895f460b7a80";
  CHECK(*decode_request(encode(stop)) == stop);
  ProjectReply reply{7, {"a line"}, "project 'team-a' is over its quota: VCPU: 1 used + 2 asked > 2", {"u1", "u2"}};
  CHECK(*decode_reply(encode(reply)) == reply);
  CHECK_FALSE(decode_request(R"({"query":"resources=VCPU:1"})"));  // no action
  CHECK_FALSE(decode_request(R"({"action":"reboot"})"));
  CHECK_FALSE(decode_request(R"({"action":"schedule","count":0})"));
  CHECK_FALSE(decode_reply(R"({"exit_code":300})"));
  // The same uuids for every try of one request, and others for another.
  CHECK(request_instance_uuid("r1", 0) == request_instance_uuid("r1", 0));
  CHECK(request_instance_uuid("r1", 0) != request_instance_uuid("r1", 1));
  CHECK(request_instance_uuid("r1", 0) != request_instance_uuid("r2", 0));
  CHECK(is_uuid(request_instance_uuid("r1", 0)));
}

TEST_CASE("a project's standing is judged from its three reads: record, own quota, defaults") {
  auto kv = [](std::string value, int64_t mod_revision = 7) {
    KeyValue one;
    one.value = std::move(value);
    one.mod_revision = mod_revision;
    return one;
  };
  auto ranges = [](std::vector<KeyValue> record, std::vector<KeyValue> own, std::vector<KeyValue> defaults) {
    std::vector<RangeResult> read(3);
    read[0].kvs = std::move(record);
    read[1].kvs = std::move(own);
    read[2].kvs = std::move(defaults);
    return read;
  };
  const std::string team = encode(ProjectRecord{1, false});

  SECTION("a project's own limit over the defaults, and its record's revision to guard the hand-over") {
    auto standing = project_standing("team-a", ranges({kv(team, 42)}, {kv(encode_limits({{"VCPU", 8}}))},
                                                      {kv(encode_limits({{"VCPU", 4}, {"instances", 10}}))}));
    REQUIRE(standing);
    CHECK(standing->revision == 42);
    CHECK(standing->limits == Limits{{"VCPU", 8}, {"instances", 10}});
  }
  SECTION("the default project has no record, and no revision") {
    auto standing = project_standing(std::string(default_project), ranges({}, {}, {}));
    REQUIRE(standing);
    CHECK(standing->revision == 0);
    CHECK(standing->limits.empty());
  }
  SECTION("unknown, being deleted, or unreadable: refused, each saying so") {
    auto unknown = project_standing("team-a", ranges({}, {}, {}));
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error() == errc::not_found);
    auto deleting = project_standing("team-a", ranges({kv(encode(ProjectRecord{1, true}))}, {}, {}));
    REQUIRE_FALSE(deleting);
    CHECK(deleting.error() == errc::changed);
    auto garbage = project_standing("team-a", ranges({kv(team)}, {kv("{not json")}, {}));
    REQUIRE_FALSE(garbage);
    CHECK_THAT(garbage.error().message(), Catch::Contains("the quota of project 'team-a'"));
    CHECK_FALSE(project_standing("team-a", std::vector<RangeResult>(2)));  // an answer short of a range
  }
  SECTION("a name that is not one is refused before anything is read") {
    CHECK(check_project_name("team-a"));
    CHECK(check_project_name("Team/A").error() == errc::invalid_argument);
  }
}
