#include "model/records.hpp"

#include "catch_result.hpp"

using namespace toyvm;

TEST_CASE("host records survive a round trip") {
  HostRecord r{"c1", "853557e9-7dc3-438c-9239-f54b9673f509", "READY", {{"VCPU", 16}, {"MEMORY_MB", 512}},
               "0.1.0", 1700000000};
  auto back = decode_host(encode(r));
  REQUIRE(back);
  CHECK(*back == r);
}

TEST_CASE("work specs survive a round trip") {
  WorkSpec s;
  s.uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";
  s.name = "web \"1\"";
  s.image = "debian";
  s.query = "resources=VCPU:1";
  s.availability_zone = "east";
  s.resources = {{"VCPU", 1}};
  s.user_data = std::string("#cloud-config\n\0\xff binary", 23);
  s.keys = {{"alice", "ssh-ed25519 AAAA alice@example"}, {"bob", "ssh-rsa BBBB"}};
  s.power = PowerState::stopped;
  s.attempt = 2;
  s.created_at = 42;
  s.project = "team-a";
  s.user = "alice";
  auto back = decode_work(encode(s));
  REQUIRE(back);
  CHECK(*back == s);
  s.group = "web";
  s.group_policy = GroupPolicy::soft_anti_affinity;
  back = decode_work(encode(s));
  REQUIRE(back);
  CHECK(*back == s);
}

TEST_CASE("instance records survive a round trip, with and without an error") {
  InstanceRecord r;
  r.uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";
  r.host = "853557e9-7dc3-438c-9239-f54b9673f509";
  r.state = InstanceState::active;
  r.ip = "192.168.122.10";
  r.updated_at = 1;
  auto back = decode_instance(encode(r));
  REQUIRE(back);
  CHECK(*back == r);
  r.ip.clear();
  r.no_address = true;
  CHECK_THAT(encode(r), Catch::Contains("\"no_address\":true"));
  back = decode_instance(encode(r));
  REQUIRE(back);
  CHECK(*back == r);
  CHECK_FALSE(decode_instance(R"({"uuid":"7387cdc8-291c-4b02-87ce-895f460b7a80","no_address":"yes"})"));
  r.no_address = false;
  r.state = InstanceState::error;
  r.error_code = "launch_failure";
  r.error_message = "no such\nthing";
  r.releasing = true;
  back = decode_instance(encode(r));
  REQUIRE(back);
  CHECK(*back == r);
}

TEST_CASE("unknown fields are ignored so newer writers do not break older readers") {
  auto back = decode_work(R"({"uuid":"7387cdc8-291c-4b02-87ce-895f460b7a80","future":{"x":[1,2]},"power":"running"})");
  REQUIRE(back);
  CHECK(back->power == PowerState::running);
}

TEST_CASE("garbage decodes to corrupt_record with a detail, never a crash") {
  const char* garbage[] = {"", "not json", "[]", "{", R"({"uuid":"x"})", R"({"uuid":7})", "\xff\xfe\x00"};
  for (const char* text : garbage) {
    INFO(text);
    auto work = decode_work(text);
    CHECK_FALSE(work);
    CHECK(work.error() == errc::corrupt_record);
    CHECK_FALSE(said(work).empty());
    CHECK_FALSE(decode_instance(text));
    CHECK_FALSE(decode_host(text));
  }
}

TEST_CASE("work specs with bad field values are refused") {
  const char* bad[] = {
      R"({"uuid":"7387cdc8-291c-4b02-87ce-895f460b7a80","power":"sideways"})",
      R"({"uuid":"7387cdc8-291c-4b02-87ce-895f460b7a80","resources":{"VCPU":"one"}})",
      R"({"uuid":"7387cdc8-291c-4b02-87ce-895f460b7a80","resources":{"vcpu":1}})",
      R"({"uuid":"7387cdc8-291c-4b02-87ce-895f460b7a80","attempt":-1})",
      // A policy added by a newer writer: not to be read as "no policy".
      R"({"uuid":"7387cdc8-291c-4b02-87ce-895f460b7a80","group":"web","group_policy":"rack-anti-affinity"})",
  };
  for (const char* text : bad) {
    INFO(text);
    CHECK_THAT(said(decode_work(text)), Catch::Contains("bad field"));
  }
}

#include "model/moves.hpp"

TEST_CASE("a move record round-trips, and one this reader cannot follow is corrupt, never another move") {
  MoveRecord move{.instance = "7387cdc8-291c-4b02-87ce-895f460b7a80",
                  .migration = "11111111-2222-4333-8444-555555555555",
                  .source = "aaaaaaaa-0000-4000-8000-000000000001",
                  .destination = "aaaaaaaa-0000-4000-8000-000000000002",
                  .kind = MoveKind::resize,
                  .state = MoveState::claimed,
                  .started_at = 1'700'000'000'000,
                  .query = "resources=VCPU:2,MEMORY_MB:512,DISK_GB:2"};
  auto back = decode_move(encode(move));
  REQUIRE(back);
  CHECK(*back == move);

  std::string newer = encode(move);
  newer.replace(newer.find("\"claimed\""), 9, "\"paused\"");
  CHECK(decode_move(newer).error() == errc::corrupt_record);
  CHECK_THAT(said(decode_move(newer)), Catch::Contains("unknown state 'paused'"));
  std::string no_migration = encode(move);
  no_migration.replace(no_migration.find("11111111"), 8, "zzzzzzzz");
  CHECK_THAT(said(decode_move(no_migration)), Catch::Contains("migration"));
  for (const char* garbage : {"", "[]", "{", R"({"instance":7})"}) CHECK_FALSE(said(decode_move(garbage)).empty());

  std::string no_query = encode(move);
  no_query.replace(no_query.find(",\"query\""), no_query.find("\"", no_query.find("resources=")) - no_query.find(",\"query\"") + 1, "");
  CHECK_THAT(said(decode_move(no_query)), Catch::Contains("a resize without its query"));

  // An operator's abort travels with it; anything but a boolean there is not read as one.
  MoveRecord aborted = move;
  aborted.abort = true;
  back = decode_move(encode(aborted));
  REQUIRE(back);
  CHECK(back->abort);
  std::string bad_abort = encode(aborted);
  bad_abort.replace(bad_abort.find("\"abort\":true"), 12, "\"abort\":\"yes\"");
  CHECK_THAT(said(decode_move(bad_abort)), Catch::Contains("invalid abort"));

  // Preparing, it names no destination yet; claimed, it must.
  MoveRecord preparing = move;
  preparing.state = MoveState::preparing;
  preparing.destination.clear();
  back = decode_move(encode(preparing));
  REQUIRE(back);
  CHECK(*back == preparing);
  preparing.state = MoveState::claimed;
  CHECK_THAT(said(decode_move(encode(preparing))), Catch::Contains("claimed, but without a destination"));

  // Ready says where the guest goes; a ready record without it cannot be followed.
  move.kind = MoveKind::live;
  move.state = MoveState::ready;
  move.libvirt_uri = "qemu+tcp://b/system";
  move.migration_uri = "tcp://b";
  move.domain_xml = "<domain/>";
  back = decode_move(encode(move));
  REQUIRE(back);
  CHECK(*back == move);
  move.kind = MoveKind::cold;
  move.disk = "/var/lib/toyvm/instances/7387cdc8-291c-4b02-87ce-895f460b7a80.qcow2";
  back = decode_move(encode(move));
  REQUIRE(back);
  CHECK(*back == move);
  move.disk.clear();
  CHECK_THAT(said(decode_move(encode(move))), Catch::Contains("without the disk it goes to"));
  move.domain_xml.clear();
  CHECK_THAT(said(decode_move(encode(move))), Catch::Contains("without where the guest goes"));
}

TEST_CASE("a move: its asker claims, the destination prepares, the source migrates, either switches over") {
  using enum MoveAction;
  using S = MoveState;
  using D = DomainState;
  auto source = [](S state, D here = D::running, bool job = false, bool wanted = true, bool overdue = false) {
    return decide_move(MoveView{.source = true, .state = state, .here = here, .job = job, .still_wanted = wanted,
                                .overdue = overdue});
  };
  auto destination = [](S state, D here = D::absent, bool job = false) {
    return decide_move(MoveView{.source = false, .state = state, .here = here, .job = job});
  };
  // The asker moves the books and claims the destination; a move it left unclaimed is undone.
  CHECK(source(S::preparing) == none);
  CHECK(source(S::preparing, D::running, false, true, true) == revert);
  CHECK(source(S::claimed) == none);
  CHECK(destination(S::preparing) == none);
  CHECK(destination(S::claimed) == prepare);
  CHECK(source(S::ready) == migrate);
  CHECK(destination(S::ready) == none);
  // The guest arrives paused while the job runs; it runs there once the job is done.
  CHECK(destination(S::ready, D::running, true) == none);
  CHECK(destination(S::ready, D::running) == switch_over);
  CHECK(source(S::switched, D::absent) == settle);
  CHECK(destination(S::switched, D::running) == none);
  // A move whose source died after the switch: the destination ends it.
  CHECK(decide_move(MoveView{.source = false, .state = S::switched, .here = D::running, .peer_alive = false}) ==
        settle);

  // A job still running (an agent restarted during it) may yet take the guest: nobody acts.
  CHECK(source(S::ready, D::running, true) == none);
  // The guest is not on the source: the destination is asked whether it runs there, and says.
  CHECK(source(S::ready, D::absent) == left);
  CHECK(source(S::left_source, D::absent) == none);
  CHECK(destination(S::left_source, D::running) == switch_over);
  CHECK(destination(S::left_source, D::stopped) == switch_over);
  CHECK(destination(S::left_source, D::running, true) == none);
  // On neither host (a source whose domains were lost): undone, and its source builds it again.
  CHECK(destination(S::left_source, D::absent) == revert);

  // A stop or destroy asked before the guest left, a destination that never prepared, a guest
  // no longer running: the move reverts.
  CHECK(source(S::preparing, D::running, false, false) == revert);
  CHECK(source(S::claimed, D::running, false, false) == revert);
  CHECK(source(S::claimed, D::running, false, true, true) == revert);
  CHECK(source(S::ready, D::running, false, false) == revert);
  CHECK(source(S::ready, D::stopped) == revert);
  CHECK(source(S::reverting) == unwind);
  CHECK(destination(S::reverting) == clean_up);
  CHECK(destination(S::reverting, D::stopped) == clean_up);
  // Never removed on a guess: a guest running at the destination while the move reverts stays.
  CHECK(destination(S::reverting, D::running) == none);

  // libvirt's daemon died between sending the guest and hearing whether the destination runs
  // it: the guest is paused on the source with no job. Only the destination can tell: asked,
  // it switches over what runs there (the source then removes its copy) or undoes the move
  // (the source then resumes it). A copy paused at the destination is libvirt's to finish.
  CHECK(source(S::ready, D::paused) == left);
  CHECK(source(S::ready, D::paused, true) == none);  // the send's own last moments
  CHECK(source(S::left_source, D::paused) == none);
  CHECK(destination(S::left_source, D::paused) == none);
  CHECK(destination(S::ready, D::paused) == none);
  CHECK(destination(S::reverting, D::paused) == none);
  CHECK(source(S::switched, D::paused) == settle);
  CHECK(source(S::reverting, D::paused) == unwind);
}

TEST_CASE("a cold move: the source copies the disk of its guest, off, and the destination takes it") {
  using enum MoveAction;
  using S = MoveState;
  using D = DomainState;
  auto source = [](S state, D here, bool wanted = true) {
    return decide_move(MoveView{.source = true, .kind = MoveKind::cold, .state = state, .here = here,
                                .still_wanted = wanted});
  };
  auto destination = [](S state, D here = D::absent) {
    return decide_move(MoveView{.source = false, .kind = MoveKind::cold, .state = state, .here = here});
  };
  CHECK(source(S::preparing, D::stopped) == none);
  CHECK(destination(S::claimed) == prepare);
  // Running or stopped, the guest's disk goes while it is off; nothing runs on the destination.
  CHECK(source(S::ready, D::running) == copy);
  CHECK(source(S::ready, D::stopped) == copy);
  CHECK(destination(S::ready) == none);
  CHECK(source(S::copied, D::stopped) == none);
  CHECK(destination(S::copied) == switch_over);
  CHECK(destination(S::copied, D::stopped) == switch_over);
  CHECK(source(S::switched, D::stopped) == settle);
  // Destroyed before its disk left, or its domain lost here: the move does not happen.
  CHECK(source(S::ready, D::stopped, false) == revert);
  CHECK(source(S::ready, D::absent) == revert);
  CHECK(destination(S::reverting, D::stopped) == clean_up);
}

TEST_CASE("a move whose other host is gone for good is ended from what this side knows, never into two copies") {
  using enum MoveAction;
  using S = MoveState;
  using D = DomainState;
  auto source = [](S state, D here, MoveKind kind = MoveKind::live, bool job = false) {
    return decide_move(MoveView{.source = true, .kind = kind, .state = state, .here = here, .job = job,
                                .peer_alive = false});
  };
  auto destination = [](S state, D here, MoveKind kind = MoveKind::live, bool job = false) {
    return decide_move(MoveView{.source = false, .kind = kind, .state = state, .here = here, .job = job,
                                .peer_alive = false});
  };
  // The destination died: nothing is sent to it, and a guest that left is the destination's or
  // nobody's (its work follows the books, for an evacuation of that host to rebuild it).
  CHECK(source(S::claimed, D::running) == revert);
  CHECK(source(S::ready, D::running) == revert);
  CHECK(source(S::ready, D::running, MoveKind::live, true) == none);  // a job still running ends first
  CHECK(source(S::ready, D::absent) == left);
  CHECK(source(S::left_source, D::absent) == switch_over);
  CHECK(source(S::ready, D::paused) == left);  // a send libvirt could not finish: the same
  CHECK(source(S::left_source, D::paused) == switch_over);
  CHECK(source(S::ready, D::running, MoveKind::cold) == revert);
  CHECK(source(S::copied, D::stopped, MoveKind::cold) == revert);
  CHECK(source(S::switched, D::absent) == settle);
  CHECK(source(S::reverting, D::running) == unwind);
  // The source died: what was never sent stays there (an evacuation of it moves it on).
  CHECK(destination(S::claimed, D::absent) == revert);
  CHECK(destination(S::ready, D::absent) == revert);
  CHECK(destination(S::ready, D::absent, MoveKind::live, true) == none);  // arriving still
  CHECK(destination(S::ready, D::running) == switch_over);                // it arrived
  CHECK(destination(S::ready, D::absent, MoveKind::cold) == revert);
  CHECK(destination(S::copied, D::absent, MoveKind::cold) == switch_over);  // its disk is here
  CHECK(destination(S::switched, D::running) == settle);
  CHECK(destination(S::reverting, D::running) == none);
}

TEST_CASE("an evacuation stands in for a dead source by the same table: what was not sent is undone") {
  using enum MoveAction;
  using S = MoveState;
  auto evacuating = [](S state, MoveKind kind = MoveKind::live, bool in_place = false) {
    MoveRecord move{.instance = "i", .migration = "m", .source = "a", .destination = in_place ? "a" : "b",
                    .kind = kind, .state = state};
    return decide_move(dead_source_view(move));
  };
  CHECK(evacuating(S::preparing) == revert);
  CHECK(evacuating(S::claimed) == revert);
  CHECK(evacuating(S::ready) == left);  // it may have left: the destination says whether it runs there
  CHECK(evacuating(S::ready, MoveKind::cold) == revert);  // its disk was never sent
  CHECK(evacuating(S::left_source) == none);              // the destination's to answer
  CHECK(evacuating(S::copied, MoveKind::cold) == none);
  CHECK(evacuating(S::switched) == settle);
  CHECK(evacuating(S::reverting) == unwind);
  CHECK(evacuating(S::claimed, MoveKind::resize, true) == revert);
  CHECK(evacuating(S::switched, MoveKind::resize, true) == settle);
}

TEST_CASE("an aborted move reverts until its guest has left; a migration running is aborted, not raced") {
  using enum MoveAction;
  using S = MoveState;
  using D = DomainState;
  auto source = [](S state, D here, MoveKind kind = MoveKind::live, bool job = false) {
    return decide_move(MoveView{.source = true, .kind = kind, .state = state, .here = here, .job = job,
                                .aborted = true});
  };
  CHECK(source(S::preparing, D::running) == revert);
  CHECK(source(S::claimed, D::running) == revert);
  CHECK(source(S::ready, D::running) == revert);
  CHECK(source(S::ready, D::running, MoveKind::live, true) == none);
  CHECK(source(S::ready, D::running, MoveKind::cold) == revert);
  CHECK(decide_move(MoveView{.source = true, .kind = MoveKind::resize, .in_place = true, .state = S::claimed,
                             .here = D::running, .aborted = true}) == revert);
  // Past the point of no return the move goes on.
  CHECK(source(S::left_source, D::absent) == none);
  CHECK(source(S::switched, D::absent) == settle);
}

TEST_CASE("a live move may take its completion timeout per GiB of its memory and disk") {
  using std::chrono::milliseconds;
  CHECK(completion_timeout({{"MEMORY_MB", 1024}, {"DISK_GB", 3}}, 800) == milliseconds(3'200'000));
  CHECK(completion_timeout({{"MEMORY_MB", 512}, {"DISK_GB", 1}}, 10) == milliseconds(15'000));
  CHECK(completion_timeout({{"MEMORY_MB", 128}}, 10) == milliseconds(10'000));  // at least a GiB's worth
}

TEST_CASE("a resize on its own host: claimed, the guest made its new size there, switched, settled") {
  using enum MoveAction;
  using S = MoveState;
  using D = DomainState;
  auto in_place = [](S state, D here, bool wanted = true) {
    return decide_move(MoveView{.source = true, .kind = MoveKind::resize, .in_place = true, .state = state,
                                .here = here, .still_wanted = wanted});
  };
  CHECK(in_place(S::preparing, D::running) == none);
  CHECK(in_place(S::claimed, D::running) == resize_here);
  CHECK(in_place(S::claimed, D::stopped) == resize_here);
  CHECK(in_place(S::switched, D::stopped) == settle);
  CHECK(in_place(S::claimed, D::running, false) == revert);
  CHECK(in_place(S::claimed, D::absent) == revert);
  CHECK(in_place(S::reverting, D::stopped) == unwind);
  CHECK(in_place(S::ready, D::stopped) == none);
}

TEST_CASE("a resize gives the work its new query and amounts; its disk only grows") {
  WorkSpec work;
  work.query = "resources=VCPU:1,MEMORY_MB:128,DISK_GB:1";
  work.resources = {{"VCPU", 1}, {"MEMORY_MB", 128}, {"DISK_GB", 1}};
  auto bigger = resized(work, "resources=VCPU:2,MEMORY_MB:256,DISK_GB:2");
  REQUIRE(bigger);
  CHECK(bigger->query == "resources=VCPU:2,MEMORY_MB:256,DISK_GB:2");
  CHECK(bigger->resources == ResourceAmounts{{"VCPU", 2}, {"MEMORY_MB", 256}, {"DISK_GB", 2}});
  CHECK(resized(work, "resources=VCPU:1,MEMORY_MB:64,DISK_GB:1"));  // less memory is fine
  CHECK_THAT(said(resized(work, "resources=VCPU:1,MEMORY_MB:128")), Catch::Contains("a disk only grows"));
  CHECK(resized(work, "resources=VCPU:x").error() == errc::invalid_argument);
}
