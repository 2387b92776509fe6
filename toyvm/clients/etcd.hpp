#pragma once
// A thin client for etcd's v3 API over gRPC (KV, Watch, Lease). Calls are coroutines on the
// caller's executor; gRPC's own threads complete them and hand the results to the Asio loop.
// Transactions, and reads of the present, asked for while one of their kind is on its way go
// together in the next request (each decided and answered as if alone). No gRPC type
// appears here, so including this header is cheap.

#include "core/async.hpp"
#include "core/config.hpp"
#include "core/error.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace toyvm {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct RangeResult {
  int64_t revision = 0;  // the store's revision when read
  std::vector<KeyValue> kvs;
  bool more = false;
  int64_t count = 0;
};

struct EtcdCompare {
  enum class Target { version, create_revision, mod_revision, value };
  enum class Result { equal, greater, less, not_equal };
  std::string key;
  Target target = Target::version;
  Result result = Result::equal;
  int64_t number = 0;
  std::string value;

  static EtcdCompare absent(std::string key) { return {std::move(key), Target::version, Result::equal, 0, {}}; }
  static EtcdCompare present(std::string key) { return {std::move(key), Target::version, Result::greater, 0, {}}; }
  static EtcdCompare mod_revision_is(std::string key, int64_t rev) {
    return {std::move(key), Target::mod_revision, Result::equal, rev, {}};
  }
};

struct EtcdOp {
  enum class Kind { put, erase, range };
  Kind kind = Kind::put;
  std::string key;
  std::string value;      // put
  std::string range_end;  // erase, range
  int64_t lease = 0;      // put
  int64_t limit = 0;      // range: at most this many keys, the first in key order; 0: all

  static EtcdOp put(std::string key, std::string value, int64_t lease = 0) {
    return {Kind::put, std::move(key), std::move(value), {}, lease};
  }
  static EtcdOp erase(std::string key, std::string range_end = {}) {
    return {Kind::erase, std::move(key), {}, std::move(range_end), 0};
  }
  static EtcdOp get(std::string key, std::string range_end = {}, int64_t limit = 0) {
    return {Kind::range, std::move(key), {}, std::move(range_end), 0, limit};
  }
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  std::vector<RangeResult> ranges;  // one per range op of the branch taken, in order
};

struct WatchEvent {
  enum class Type { put, erase };
  Type type = Type::put;
  KeyValue kv;
  std::optional<KeyValue> prev;  // with prev_kv
};

struct WatchBatch {
  int64_t revision = 0;          // header revision
  int64_t compact_revision = 0;  // nonzero: history before this is gone; re-list
  bool created = false;
  bool canceled = false;
  std::string cancel_reason;
  std::vector<WatchEvent> events;
  Error error;                   // set when the stream ended (etcd down, cancelled)
};

struct WatchOptions {
  std::string key;
  std::string range_end;
  int64_t start_revision = 0;  // 0: from now
  bool prev_kv = false;
};

class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
  // The next response; after one with `error` set the stream is over.
  virtual awaitable<WatchBatch> next() = 0;
  // Asks etcd to cancel the watch (WatchCancelRequest); next() then sees `canceled`.
  virtual void cancel() = 0;
  // Ends the stream here, without asking etcd: next() then sees an error.
  virtual void abort() = 0;
};

// A client that keeps its channel alive (EtcdConfig::keepalive) pings it every 10 s and gives
// each ping 5 s: a member that stops answering is left for another within 15 s.
inline constexpr std::chrono::seconds etcd_ping_interval{10}, etcd_ping_timeout{5};

// How often a lease of `ttl` is renewed on a kept-alive channel: as seldom as still leaves,
// after a renewal that went unanswered, the time to notice the stalled member and renew
// through another (each renewal costs the member an answer and, on a follower, a request to
// its leader: at 10,000 hosts they are most of what etcd does at rest); never more than half
// the TTL apart, never less than a third (a short TTL cannot outlast a stall either way).
std::chrono::milliseconds lease_renewal_interval(std::chrono::milliseconds ttl);

class EtcdLeaseKeeper {
 public:
  virtual ~EtcdLeaseKeeper() = default;
  // One keep-alive round trip; the remaining TTL, 0 when the lease is gone.
  virtual awaitable<result<int64_t>> ping() = 0;
};

// A permission of an etcd role: on one key, or on [key, range_end).
struct EtcdPermission {
  enum class Type { read, write, readwrite };
  Type type = Type::read;
  std::string key;
  std::string range_end;

  bool operator==(const EtcdPermission&) const = default;
};

class EtcdClient {
 public:
  static std::shared_ptr<EtcdClient> create(const EtcdConfig& config);
  virtual ~EtcdClient() = default;

  virtual awaitable<result<RangeResult>> range(std::string key, std::string range_end = {},
                                               int64_t revision = 0) = 0;
  awaitable<result<RangeResult>> range_prefix(std::string prefix);
  virtual awaitable<result<int64_t>> put(std::string key, std::string value, int64_t lease = 0) = 0;
  // Returns how many keys were deleted.
  virtual awaitable<result<int64_t>> erase(std::string key, std::string range_end = {}) = 0;
  virtual awaitable<result<TxnResult>> txn(std::vector<EtcdCompare> compare,
                                           std::vector<EtcdOp> success,
                                           std::vector<EtcdOp> failure = {}) = 0;
  virtual awaitable<result<int64_t>> lease_grant(int64_t ttl_seconds) = 0;
  virtual awaitable<result<void>> lease_revoke(int64_t lease) = 0;
  virtual std::unique_ptr<EtcdLeaseKeeper> keep_alive(int64_t lease) = 0;
  virtual std::unique_ptr<EtcdWatch> watch(WatchOptions options) = 0;

  // For messages: "http://127.0.0.1:2379,..."
  virtual const std::string& endpoints_text() const = 0;

  // etcd's own users and roles (its Auth API; root's to call, but a user may read its own
  // roles). A user without a password authenticates by its TLS client certificate's common
  // name. Adding what exists is errc::already_exists; reading what does not, errc::not_found.
  virtual awaitable<result<void>> user_add(std::string name, std::string password);
  virtual awaitable<result<std::vector<std::string>>> user_roles(std::string name);
  virtual awaitable<result<void>> user_delete(std::string name);
  virtual awaitable<result<void>> user_grant_role(std::string name, std::string role);
  virtual awaitable<result<void>> user_revoke_role(std::string name, std::string role);
  virtual awaitable<result<void>> role_add(std::string name);
  virtual awaitable<result<std::vector<EtcdPermission>>> role_permissions(std::string name);
  virtual awaitable<result<void>> role_delete(std::string name);
  virtual awaitable<result<void>> role_grant(std::string name, EtcdPermission permission);
};

// A transaction asked again, with backoff, while etcd does not answer (an election's
// "leader changed", a member restarting) until `patience` has passed; any other error, or the
// last unanswered one, is returned. Only for a transaction that may land more than once
// (reads; unguarded puts of the caller's own values, the same whichever lands).
awaitable<result<TxnResult>> txn_asking_again(EtcdClient& etcd, std::vector<EtcdCompare> compare,
                                              std::vector<EtcdOp> success, std::chrono::milliseconds patience);

// Lists [key, range_end), then follows its changes from the listing's revision: a broken or
// compacted watch lists again, an etcd that does not answer is asked again with backoff
// (100 ms to 5 s). `listed` gets each whole listing, `changed` each event after it. Ends
// when `stopping()` says so, which is asked between batches. `listed_revision`: the caller
// has listed the range already, at that revision, and the first watch starts after it.
awaitable<void> follow_range(EtcdClient& etcd, std::string key, std::string range_end,
                             std::function<void(const RangeResult&)> listed,
                             std::function<void(const WatchEvent&)> changed, std::function<bool()> stopping,
                             int64_t listed_revision = 0);

// Follows one key from `revision` until `seen` returns true or `timeout` passes. A watch that
// ends (etcd restarted, its member lost, history compacted) is made again from a fresh read of
// the key, which `seen` gets as an event (an erase when the key is gone), so nothing that
// happened meanwhile is missed; an etcd that does not answer is asked again with backoff.
// true: `seen` ended it; false: the time ran out; an error: etcd did not answer meanwhile.
awaitable<result<bool>> follow_key(EtcdClient& etcd, std::string key, int64_t revision,
                                   std::chrono::milliseconds timeout,
                                   std::function<bool(const WatchEvent&)> seen);

}  // namespace toyvm
