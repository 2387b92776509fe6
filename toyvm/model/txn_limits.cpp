#include "model/txn_limits.hpp"

#include <algorithm>

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

namespace {

// Where a span ends, as the first key past it; empty: never (a span to the end of the keys).
std::string span_end(const KeySpan& span) {
  if (span.range_end.empty()) return span.key + '\0';
  if (span.range_end == std::string(1, '\0')) return {};
  return span.range_end;
}

bool before(const std::string& key, const std::string& end) { return end.empty() || key < end; }

}  // namespace

bool spans_meet(const KeySpan& a, const KeySpan& b) {
  return before(a.key, span_end(b)) && before(b.key, span_end(a));
}

bool TxnNest::meets(const KeySpan& span, const std::set<std::string>& singles, const std::vector<KeySpan>& ranges) {
  if (span.range_end.empty()) {
    if (singles.count(span.key) > 0) return true;
  } else {
    auto from = singles.lower_bound(span.key);
    if (from != singles.end() && before(*from, span_end(span))) return true;
  }
  for (const KeySpan& range : ranges)
    if (spans_meet(span, range)) return true;
  return false;
}

bool TxnNest::take(const TxnCost& cost, const std::vector<KeySpan>& keys, bool reads_only) {
  const size_t own = std::max(cost.compares, cost.ops);
  if (taken_ == 0) {
    reads_only_ = reads_only;
  } else {
    if (reads_only != reads_only_ || bytes_ + cost.bytes > max_bytes_) return false;
    if (reads_only_) {
      if (ops_ + cost.ops > max_ops_) return false;  // reads never meet reads
    } else {
      if (taken_ + 1 + std::max(largest_, own) > max_ops_) return false;
      for (const KeySpan& span : keys) {
        if (span.written ? meets(span, named_, named_ranges_) : meets(span, written_, written_ranges_)) return false;
      }
    }
  }
  ++taken_;
  largest_ = std::max(largest_, own);
  ops_ += cost.ops;
  bytes_ += cost.bytes;
  if (!reads_only_) {
    for (const KeySpan& span : keys) {
      if (span.range_end.empty()) {
        named_.insert(span.key);
        if (span.written) written_.insert(span.key);
      } else {
        named_ranges_.push_back(span);
        if (span.written) written_ranges_.push_back(span);
      }
    }
  }
  return true;
}

}  // namespace toyvm
