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
