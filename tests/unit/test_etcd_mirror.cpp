#include "clients/etcd_mirror.hpp"

#include "fakes/fake_etcd.hpp"

#include <catch2/catch.hpp>

#include <chrono>

using namespace toyvm;

namespace {

KeyValue kv(std::string key, std::string value, int64_t revision) {
  return KeyValue{std::move(key), std::move(value), revision, revision, 1, 0};
}
WatchEvent put(std::string key, std::string value, int64_t revision) {
  return WatchEvent{WatchEvent::Type::put, kv(std::move(key), std::move(value), revision), std::nullopt};
}
WatchEvent erase(std::string key, int64_t revision) {
  return WatchEvent{WatchEvent::Type::erase, kv(std::move(key), "", revision), std::nullopt};
}
std::map<std::string, std::string> values(const RangeResult& listed) {
  std::map<std::string, std::string> out;
  for (const KeyValue& one : listed.kvs) out[one.key] = one.value;
  return out;
}

struct Followed {
  std::vector<std::string> listed;
  std::vector<std::string> heard;
};
// follow_range over `etcd` until it has heard a change, or has listed and watches after it
// (10 s at most): what it listed and heard.
Followed follow_until_heard(fakes::FakeEtcd& etcd, const std::string& key, int64_t listed_revision) {
  asio::io_context io;
  Followed out;
  bool done = false;
  asio::co_spawn(io,
                 follow_range(
                     etcd, key, std::string(),
                     [&](const RangeResult& listing) {
                       for (const KeyValue& kv : listing.kvs) out.listed.push_back(kv.value);
                     },
                     [&](const WatchEvent& event) { out.heard.push_back(event.kv.value); },
                     [&] { return !out.heard.empty() || (!out.listed.empty() && !etcd.watched.empty()); },
                     listed_revision),
                 [&](std::exception_ptr) { done = true; });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done && std::chrono::steady_clock::now() < deadline) io.run_one_for(std::chrono::milliseconds(20));
  REQUIRE(done);
  return out;
}

}  // namespace

TEST_CASE("follow_range watches from its caller's listing without reading again, and lists when it has none") {
  fakes::FakeEtcd etcd;
  etcd.replay_watches = true;
  etcd.put_now("disabled/h", "maintenance");
  const int64_t read_at = etcd.revision();  // the caller's reading
  etcd.put_now("disabled/h", "upgrade");     // a change between that reading and the watch
  etcd.put_now("disabled/other", "x");

  SECTION("from the caller's listing: no read, and the change since it is heard") {
    Followed followed = follow_until_heard(etcd, "disabled/h", read_at);
    CHECK(etcd.ranges == 0);
    CHECK(followed.listed.empty());
    CHECK(followed.heard == std::vector<std::string>{"upgrade"});
    REQUIRE(etcd.watched.size() == 1);
    CHECK(etcd.watched.front().start_revision == read_at + 1);
  }
  SECTION("without one: a listing first, the watch after it") {
    Followed followed = follow_until_heard(etcd, "disabled/h", 0);
    CHECK(etcd.ranges == 1);
    CHECK(followed.listed == std::vector<std::string>{"upgrade"});
    CHECK(followed.heard.empty());
    REQUIRE(etcd.watched.size() == 1);
    CHECK(etcd.watched.front().start_revision == etcd.revision() + 1);
  }
}

TEST_CASE("a mirror is the listing with the watch's events since, at the last event's revision") {
  EtcdMirror mirror;
  CHECK(mirror.revision() == 0);
  mirror.take(RangeResult{10, {kv("w/a", "1", 5), kv("w/b", "1", 7)}, false, 2});
  // One transaction that wrote two keys: both its events share a revision, both count.
  mirror.take(put("w/c", "1", 11));
  mirror.take(put("w/d", "1", 11));
  mirror.take(put("w/a", "2", 12));
  mirror.take(erase("w/b", 13));
  const RangeResult now = mirror.listing();
  CHECK(now.revision == 13);
  CHECK(now.count == 3);
  CHECK(values(now) == std::map<std::string, std::string>{{"w/a", "2"}, {"w/c", "1"}, {"w/d", "1"}});
}

TEST_CASE("a mirror takes a listing only when it is newer than every event taken") {
  EtcdMirror mirror;
  mirror.take(RangeResult{10, {kv("w/a", "1", 5)}, false, 1});
  mirror.take(put("w/a", "2", 14));
  // A listing answered at 12, after an event of 14 arrived: it has nothing to add.
  mirror.take(RangeResult{12, {kv("w/a", "1", 5), kv("w/gone", "1", 11)}, false, 2});
  CHECK(values(mirror.listing()) == std::map<std::string, std::string>{{"w/a", "2"}});
  CHECK(mirror.revision() == 14);

  // One answered at 20 (the watch stalled, or its events are still on their way): it replaces
  // what was known, and the events it already holds change nothing when they come.
  mirror.take(RangeResult{20, {kv("w/a", "3", 18), kv("w/b", "1", 19)}, false, 2});
  mirror.take(put("w/a", "2-late", 16));
  mirror.take(put("w/b", "1", 19));
  CHECK(values(mirror.listing()) == std::map<std::string, std::string>{{"w/a", "3"}, {"w/b", "1"}});
  CHECK(mirror.listing().revision == 20);
  mirror.take(erase("w/b", 21));
  CHECK(values(mirror.listing()) == std::map<std::string, std::string>{{"w/a", "3"}});
  CHECK(mirror.revision() == 21);
}
