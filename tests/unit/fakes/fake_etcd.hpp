#pragma once
// etcd in memory, for unit tests of what is decided over it: keys with revisions, guarded
// transactions and leases as etcd keeps them, every change kept in order so that a test can
// hand them out as a watch would, and a switch that makes every call go unanswered.

#include "clients/etcd.hpp"

#include <map>
#include <utility>

namespace toyvm::fakes {

class FakeEtcd : public EtcdClient {
 public:
  bool down = false;           // every call fails as an etcd out of reach does
  int unanswered = 0;          // calls failed so, while down
  int txns = 0;                // transactions answered
  int lost_txns = 0;           // the next transactions fail as unanswered, not applied
  std::vector<WatchEvent> history;  // every change, in revision order
  int ranges = 0;              // range() calls answered
  bool replay_watches = false;  // a watch hands out the changes since its start, then ends
  std::vector<WatchOptions> watched;  // every watch asked for

  int64_t revision() const { return revision_; }
  const KeyValue* find(const std::string& key) const {
    auto found = store_.find(key);
    return found == store_.end() ? nullptr : &found->second;
  }
  // Puts at once (as another writer would), and returns the change.
  WatchEvent put_now(const std::string& key, std::string value) {
    apply(EtcdOp::put(key, std::move(value)));
    return history.back();
  }
  WatchEvent erase_now(const std::string& key) {
    apply(EtcdOp::erase(key));
    return history.back();
  }
  // The changes after `revision`.
  std::vector<WatchEvent> since(int64_t revision) const {
    std::vector<WatchEvent> later;
    for (const WatchEvent& event : history)
      if (event.kv.mod_revision > revision) later.push_back(event);
    return later;
  }

  awaitable<result<RangeResult>> range(std::string key, std::string range_end, int64_t) override {
    if (down) co_return unavailable();
    ++ranges;
    co_return read(key, range_end);
  }
  awaitable<result<int64_t>> put(std::string key, std::string value, int64_t lease) override {
    if (down) co_return unavailable();
    apply(EtcdOp::put(std::move(key), std::move(value), lease));
    co_return revision_;
  }
  awaitable<result<int64_t>> erase(std::string key, std::string range_end) override {
    if (down) co_return unavailable();
    co_return apply(EtcdOp::erase(std::move(key), std::move(range_end)));
  }
  awaitable<result<TxnResult>> txn(std::vector<EtcdCompare> compare, std::vector<EtcdOp> success,
                                   std::vector<EtcdOp> failure) override {
    if (down) co_return unavailable();
    if (lost_txns > 0) {
      --lost_txns;
      co_return unavailable();
    }
    ++txns;
    TxnResult done;
    done.succeeded = std::all_of(compare.begin(), compare.end(), [this](const EtcdCompare& c) { return holds(c); });
    for (const EtcdOp& op : done.succeeded ? success : failure) {
      if (op.kind == EtcdOp::Kind::range)
        done.ranges.push_back(read(op.key, op.range_end, op.limit));
      else
        apply(op);
    }
    done.revision = revision_;
    co_return done;
  }
  awaitable<result<int64_t>> lease_grant(int64_t) override {
    if (down) co_return unavailable();
    co_return ++last_lease_;
  }
  awaitable<result<void>> lease_revoke(int64_t lease) override {
    if (down) co_return unavailable();
    std::vector<std::string> held;
    for (const auto& [key, kv] : store_)
      if (kv.lease == lease) held.push_back(key);
    for (const std::string& key : held) apply(EtcdOp::erase(key));
    co_return result<void>();
  }
  std::unique_ptr<EtcdLeaseKeeper> keep_alive(int64_t) override { return std::make_unique<Keeper>(*this); }
  std::unique_ptr<EtcdWatch> watch(WatchOptions options) override {
    watched.push_back(options);
    auto ended = std::make_unique<EndedWatch>();
    if (replay_watches)
      for (const WatchEvent& event : since(options.start_revision - 1))
        if (in_range(event.kv.key, options.key, options.range_end)) ended->pending.events.push_back(event);
    return ended;
  }
  const std::string& endpoints_text() const override { return endpoints_; }

 private:
  struct Keeper : EtcdLeaseKeeper {
    explicit Keeper(FakeEtcd& etcd) : etcd(etcd) {}
    awaitable<result<int64_t>> ping() override {
      if (etcd.down) co_return etcd.unavailable();
      co_return int64_t(10);
    }
    FakeEtcd& etcd;
  };
  // Tests hand out changes themselves (since()); a watch here ends at once, after what it
  // replays.
  struct EndedWatch : EtcdWatch {
    WatchBatch pending;
    awaitable<WatchBatch> next() override {
      if (!pending.events.empty()) co_return std::exchange(pending, WatchBatch{});
      WatchBatch batch;
      batch.error = Error(errc::etcd_unavailable, "etcd is down");
      co_return batch;
    }
    void cancel() override {}
    void abort() override {}
  };

  Error unavailable() {
    ++unanswered;
    return Error(errc::etcd_unavailable, "etcd is down");
  }

  bool in_range(const std::string& key, const std::string& from, const std::string& end) const {
    if (end.empty()) return key == from;
    return key >= from && (end == std::string(1, '\0') || key < end);
  }

  RangeResult read(const std::string& key, const std::string& range_end, int64_t limit = 0) const {
    RangeResult listed;
    listed.revision = revision_;
    for (const auto& [k, kv] : store_) {
      if (!in_range(k, key, range_end)) continue;
      ++listed.count;
      if (limit > 0 && int64_t(listed.kvs.size()) == limit) listed.more = true;
      else listed.kvs.push_back(kv);
    }
    return listed;
  }

  bool holds(const EtcdCompare& c) const {
    const KeyValue* kv = find(c.key);
    auto compare = [&](auto have, auto want) {
      switch (c.result) {
        case EtcdCompare::Result::equal: return have == want;
        case EtcdCompare::Result::greater: return have > want;
        case EtcdCompare::Result::less: return have < want;
        case EtcdCompare::Result::not_equal: return have != want;
      }
      return false;
    };
    switch (c.target) {
      case EtcdCompare::Target::version: return compare(kv ? kv->version : 0, c.number);
      case EtcdCompare::Target::create_revision: return compare(kv ? kv->create_revision : 0, c.number);
      case EtcdCompare::Target::mod_revision: return compare(kv ? kv->mod_revision : 0, c.number);
      case EtcdCompare::Target::value: return compare(kv ? kv->value : std::string(), c.value);
    }
    return false;
  }

  // Each change gets the next revision (etcd gives one per transaction; tests only need order).
  int64_t apply(const EtcdOp& op) {
    if (op.kind == EtcdOp::Kind::put) {
      KeyValue& kv = store_[op.key];
      ++revision_;
      if (kv.version == 0) kv.create_revision = revision_;
      kv.key = op.key;
      kv.value = op.value;
      kv.mod_revision = revision_;
      kv.version += 1;
      kv.lease = op.lease;
      history.push_back(WatchEvent{WatchEvent::Type::put, kv, std::nullopt});
      return 1;
    }
    std::vector<std::string> gone;
    for (const auto& [k, kv] : store_)
      if (in_range(k, op.key, op.range_end)) gone.push_back(k);
    for (const std::string& k : gone) {
      KeyValue erased = store_[k];
      store_.erase(k);
      erased.mod_revision = ++revision_;
      erased.value.clear();
      history.push_back(WatchEvent{WatchEvent::Type::erase, erased, std::nullopt});
    }
    return int64_t(gone.size());
  }

  std::map<std::string, KeyValue> store_;
  int64_t revision_ = 1;
  int64_t last_lease_ = 100;
  std::string endpoints_ = "fake";
};

}  // namespace toyvm::fakes
