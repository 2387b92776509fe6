#pragma once
// etcd refuses a transaction with more than --max-txn-ops compares or operations (128 by
// default) or a request over --max-request-bytes (1.5 MiB). Writes of many instances at once
// are split to stay under both, before anything is claimed for them. Pure.

#include <cstddef>
#include <optional>
#include <set>
#include <string>
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

// A key, or the keys [key, range_end) when range_end is set ("\0": every key from `key` on),
// that a transaction reads (its compares, its range operations) or writes.
struct KeySpan {
  std::string key;
  std::string range_end;
  bool written = false;
};

bool spans_meet(const KeySpan& a, const KeySpan& b);

// Transactions gathered, in order, to go to etcd as one request. Those that only read (no
// compares, only range operations) go with others that only read, their operations side by
// side in one read-only transaction, which etcd answers without a raft entry. The others go
// as nested transactions: etcd decides each by its own compares, all against the store as it
// was before any of them, and refuses a request that writes a key twice; so none may write a
// key another names, and then the request does what they would do one after another. Either
// way the request's operations stay within `max_ops` (nested: one per transaction beside the
// largest one's own, `compares` or `ops`, the larger branch), its bytes within `max_bytes`.
class TxnNest {
 public:
  explicit TxnNest(size_t max_ops = etcd_max_txn_ops, size_t max_bytes = etcd_request_budget)
      : max_ops_(max_ops), max_bytes_(max_bytes) {}
  // Takes the next transaction, naming `keys`, if it may go with those taken (the first always
  // may): true when taken.
  bool take(const TxnCost& cost, const std::vector<KeySpan>& keys, bool reads_only);
  size_t size() const { return taken_; }

 private:
  // Whether `span` meets a span of `singles` or `ranges`.
  static bool meets(const KeySpan& span, const std::set<std::string>& singles, const std::vector<KeySpan>& ranges);
  size_t max_ops_, max_bytes_;
  size_t taken_ = 0, largest_ = 0, ops_ = 0, bytes_ = 0;
  bool reads_only_ = false;
  // What those taken name, and what they write: single keys, and ranges (rare: erases of a prefix).
  std::set<std::string> named_, written_;
  std::vector<KeySpan> named_ranges_, written_ranges_;
};

}  // namespace toyvm
