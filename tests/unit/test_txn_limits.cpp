#include "model/txn_limits.hpp"

#include <catch2/catch.hpp>

using namespace toyvm;

TEST_CASE("instances are split into transactions under etcd's operation and size limits") {
  // 3 compares and 3 operations each: 42 to a transaction, as many as 128 operations allow.
  std::vector<TxnCost> small(100, TxnCost{3, 3, 500});
  CHECK(*split_by_limits(small) == std::vector<size_t>{42, 84, 100});

  // 64 KiB of user data each, twice over in base64 and the record: bytes bind first.
  std::vector<TxnCost> big(20, TxnCost{2, 2, 90 * 1024});
  auto ends = *split_by_limits(big);
  CHECK(ends == std::vector<size_t>{11, 20});
  size_t first = 0;
  for (size_t end : ends) {
    size_t bytes = 0;
    for (size_t i = first; i < end; ++i) bytes += big[i].bytes;
    CHECK(bytes <= etcd_request_budget);
    first = end;
  }

  CHECK(split_by_limits({})->empty());
  CHECK(*split_by_limits({TxnCost{1, 1, etcd_request_budget}}) == std::vector<size_t>{1});
  // One that can never fit is said before anything is written.
  CHECK_FALSE(split_by_limits({TxnCost{1, 1, 10}, TxnCost{1, 1, etcd_request_budget + 1}}));
  CHECK_FALSE(split_by_limits({TxnCost{129, 1, 10}}));
}

namespace {
// How many from the front of a queue go together; `reads`: which of them only read.
size_t nestable_prefix(const std::vector<TxnCost>& costs, const std::vector<std::vector<KeySpan>>& keys,
                       const std::vector<bool>& reads = {}) {
  TxnNest nest;
  for (size_t i = 0; i < costs.size() && nest.take(costs[i], keys[i], i < reads.size() && reads[i]); ++i) {
  }
  return nest.size();
}
}  // namespace

TEST_CASE("transactions that write no key another names go together, within etcd's limits") {
  // A transaction that compares `k` and writes it.
  auto key = [](std::string k) { return std::vector<KeySpan>{KeySpan{k, {}}, KeySpan{k, {}, true}}; };
  auto reads = [](std::string k) { return std::vector<KeySpan>{KeySpan{std::move(k), {}}}; };
  const TxnCost small{1, 3, 100};

  // Distinct keys: all of them.
  CHECK(nestable_prefix({small, small, small}, {key("a"), key("b"), key("c")}) == 3);
  // A key written twice ends the prefix there, in order; so does one read where another writes.
  CHECK(nestable_prefix({small, small, small}, {key("a"), key("b"), key("a")}) == 2);
  CHECK(nestable_prefix({small, small}, {key("a"), key("a")}) == 1);
  CHECK(nestable_prefix({small, small}, {reads("a"), key("a")}) == 1);
  CHECK(nestable_prefix({small, small}, {key("a"), reads("a")}) == 1);
  // Two that only compare the same key go together.
  CHECK(nestable_prefix({small, small, small}, {reads("a"), reads("a"), key("b")}) == 3);
  // The first goes even alone, whatever it costs; an empty queue gives nothing.
  CHECK(nestable_prefix({TxnCost{1, 128, 10}, small}, {key("a"), key("b")}) == 1);
  CHECK(nestable_prefix({}, {}) == 0);

  // Ranges: a prefix meets the keys under it and nothing else; "\0" runs to the end.
  const std::vector<KeySpan> erase_prefix{KeySpan{"/i/1/", "/i/10", true}};
  CHECK(nestable_prefix({small, small}, {erase_prefix, key("/i/1/x")}) == 1);
  CHECK(nestable_prefix({small, small}, {key("/i/1/x"), erase_prefix}) == 1);
  CHECK(nestable_prefix({small, small}, {erase_prefix, key("/i/10")}) == 2);
  CHECK(nestable_prefix({small, small}, {key("/i/0"), erase_prefix}) == 2);
  CHECK(nestable_prefix({small, small}, {key("z"), {KeySpan{"m", std::string(1, '\0'), true}}}) == 1);
  CHECK(spans_meet(KeySpan{"a", "c"}, KeySpan{"b", "d"}));
  CHECK_FALSE(spans_meet(KeySpan{"a", "b"}, KeySpan{"b", "c"}));

  // The outer request's operations and the largest inner one's within 128: 31 of 97 ops each.
  std::vector<TxnCost> costs(40, TxnCost{1, 97, 10});
  std::vector<std::vector<KeySpan>> keys;
  for (int i = 0; i < 40; ++i) keys.push_back(key("k" + std::to_string(i)));
  CHECK(nestable_prefix(costs, keys) == 31);
  // And their bytes within the request's budget.
  CHECK(nestable_prefix(std::vector<TxnCost>(40, TxnCost{1, 1, etcd_request_budget / 10}), keys) == 10);
}

TEST_CASE("reads go together side by side, never with writes") {
  const auto one = [](std::string k) { return std::vector<KeySpan>{KeySpan{std::move(k), {}}}; };
  const TxnCost read{0, 1, 50};
  // Reads of the same key go together; their operations count side by side, up to 128.
  CHECK(nestable_prefix({read, read, read}, {one("a"), one("a"), one("a")}, {true, true, true}) == 3);
  CHECK(nestable_prefix(std::vector<TxnCost>(200, read), std::vector<std::vector<KeySpan>>(200, one("a")),
                        std::vector<bool>(200, true)) == 128);
  CHECK(nestable_prefix({TxnCost{0, 100, 50}, TxnCost{0, 28, 50}, read},
                        {one("a"), one("b"), one("c")}, {true, true, true}) == 2);
  // A write after reads, or reads after a write, waits for the next request.
  const std::vector<KeySpan> write{KeySpan{"w", {}, true}};
  CHECK(nestable_prefix({read, read, TxnCost{1, 1, 50}}, {one("a"), one("b"), write}, {true, true, false}) == 2);
  CHECK(nestable_prefix({TxnCost{1, 1, 50}, read}, {write, one("a")}, {false, true}) == 1);
}
