#pragma once
// etcd refuses a transaction with more than --max-txn-ops compares or operations (128 by
// default) or a request over --max-request-bytes (1.5 MiB). Writes of many instances at once
// are split to stay under both, before anything is claimed for them. Pure.

#include <cstddef>
#include <optional>
#include <vector>

namespace toyvm {

inline constexpr size_t etcd_max_txn_ops = 128;
// Under 1.5 MiB, with room for the request's own framing.
inline constexpr size_t etcd_request_budget = size_t(1) << 20;

// What one item (an instance's keys) adds to a transaction.
struct TxnCost {
  size_t compares = 0;
  size_t ops = 0;
  size_t bytes = 0;  // keys and values, compares' keys included
};

// Consecutive groups of `items` that each fit one transaction, as the index one past each
// group's last item; nullopt when one item alone does not fit.
std::optional<std::vector<size_t>> split_by_limits(const std::vector<TxnCost>& items,
                                                   size_t max_ops = etcd_max_txn_ops,
                                                   size_t max_bytes = etcd_request_budget);

}  // namespace toyvm
