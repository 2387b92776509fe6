#include "model/txn_limits.hpp"

namespace toyvm {

std::optional<std::vector<size_t>> split_by_limits(const std::vector<TxnCost>& items, size_t max_ops,
                                                   size_t max_bytes) {
  std::vector<size_t> ends;
  TxnCost group;
  for (size_t i = 0; i < items.size(); ++i) {
    const TxnCost& item = items[i];
    if (item.compares > max_ops || item.ops > max_ops || item.bytes > max_bytes) return std::nullopt;
    const bool fits = group.compares + item.compares <= max_ops && group.ops + item.ops <= max_ops &&
                      group.bytes + item.bytes <= max_bytes;
    if (!fits) {
      ends.push_back(i);
      group = {};
    }
    group.compares += item.compares;
    group.ops += item.ops;
    group.bytes += item.bytes;
  }
  if (!items.empty()) ends.push_back(items.size());
  return ends;
}

}  // namespace toyvm
