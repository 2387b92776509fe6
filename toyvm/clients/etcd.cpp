// The etcd client: its unary calls (KV reads and writes, transactions, leases granted and
// revoked, authentication) over one lazily made channel. The streams are in
// clients/etcd_streams.cpp, the plumbing in clients/etcd_grpc.cpp.

#include "clients/etcd.hpp"

#include "clients/etcd_grpc.hpp"
#include "core/metrics.hpp"
#include "model/keys.hpp"
#include "model/txn_limits.hpp"

#include <absl/synchronization/mutex.h>
#include <fmt/format.h>
#include <grpc/support/log.h>
#include <spdlog/spdlog.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/this_coro.hpp>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <utility>

namespace toyvm {
namespace {

namespace pb = etcd_grpc::pb;
using etcd_grpc::completion_queue;
using etcd_grpc::from_pb;
using etcd_grpc::from_status;
using etcd_grpc::on_completion;

RangeResult from_pb(const pb::RangeResponse& resp);

TxnResult from_pb(const pb::TxnResponse& response) {
  TxnResult out;
  out.succeeded = response.succeeded();
  out.revision = response.header().revision();
  for (const auto& op : response.responses()) {
    if (!op.has_response_range()) continue;
    out.ranges.push_back(from_pb(op.response_range()));
    out.ranges.back().revision = out.revision;  // a transaction's ranges have no header of their own
  }
  return out;
}

RangeResult from_pb(const pb::RangeResponse& resp) {
  RangeResult out;
  out.revision = resp.header().revision();
  out.more = resp.more();
  out.count = resp.count();
  out.kvs.reserve(resp.kvs_size());
  for (const auto& kv : resp.kvs()) out.kvs.push_back(from_pb(kv));
  return out;
}

void to_pb(const EtcdOp& op, pb::RequestOp& out) {
  switch (op.kind) {
    case EtcdOp::Kind::put: {
      auto* put = out.mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case EtcdOp::Kind::erase: {
      auto* del = out.mutable_request_delete_range();
      del->set_key(op.key);
      del->set_range_end(op.range_end);
      break;
    }
    case EtcdOp::Kind::range: {
      auto* range = out.mutable_request_range();
      range->set_key(op.key);
      range->set_range_end(op.range_end);
      range->set_limit(op.limit);
      break;
    }
  }
}

void to_pb(const EtcdCompare& cmp, pb::Compare& out) {
  out.set_key(cmp.key);
  out.set_result(static_cast<pb::Compare::CompareResult>(cmp.result));
  switch (cmp.target) {
    case EtcdCompare::Target::version:
      out.set_target(pb::Compare::VERSION);
      out.set_version(cmp.number);
      break;
    case EtcdCompare::Target::create_revision:
      out.set_target(pb::Compare::CREATE);
      out.set_create_revision(cmp.number);
      break;
    case EtcdCompare::Target::mod_revision:
      out.set_target(pb::Compare::MOD);
      out.set_mod_revision(cmp.number);
      break;
    case EtcdCompare::Target::value:
      out.set_target(pb::Compare::VALUE);
      out.set_value(cmp.value);
      break;
  }
}


class GrpcEtcdClient final : public EtcdClient, public std::enable_shared_from_this<GrpcEtcdClient> {
 public:
  explicit GrpcEtcdClient(const EtcdConfig& config)
      : endpoints_text_(fmt::format("{}", fmt::join(config.endpoints, ","))),
        timeout_(config.timeout),
        keep_alives_(std::make_shared<etcd_grpc::KeepAliveStreams>(
            [this](const asio::any_io_executor& executor) { return renewal_way(executor); })),
        config_(config) {}

  // gRPC 1.51 can abort on an internal refcount assertion when a channel is torn down while
  // its own threads still work on it (seen at the exit of short commands). A process has one
  // channel per client (and per leader it renewed through) and few clients, so the channels
  // stay until the process ends.
  ~GrpcEtcdClient() override {
    new std::shared_ptr<grpc::Channel>(std::move(stubs_.channel));
    for (auto& [endpoint, leader] : leaders_) new std::shared_ptr<grpc::Channel>(std::move(leader.channel));
  }

  const std::string& endpoints_text() const override { return endpoints_text_; }

  // A read of the present goes with others asked for meanwhile (see txn).
  awaitable<result<RangeResult>> range(std::string key, std::string range_end,
                                       int64_t revision) override {
    if (revision == 0) {
      // (Built outside co_await: GCC 12 miscompiles temporaries inside it.)
      const std::vector<EtcdOp> read{EtcdOp::get(std::move(key), std::move(range_end))};
      auto waiting = make_waiting_txn({}, read, {});
      auto response = co_await queue_txn(std::move(waiting));
      if (!response) co_return response.error();
      TxnResult read_back = from_pb(*response);
      if (read_back.ranges.size() != 1) co_return Error(errc::etcd_error, "etcd answered a read with no range");
      co_return std::move(read_back.ranges.front());
    }
    pb::RangeRequest request;
    request.set_key(std::move(key));
    request.set_range_end(std::move(range_end));
    request.set_revision(revision);
    auto start = [kv = stubs().kv.get()](auto* ctx, const auto& req, auto* queue) {
      return kv->PrepareAsyncRange(ctx, req, queue);
    };
    auto response = co_await unary<pb::RangeResponse>(std::move(request), start);
    if (!response) co_return response.error();
    co_return from_pb(*response);
  }

  awaitable<result<int64_t>> put(std::string key, std::string value, int64_t lease) override {
    pb::PutRequest request;
    request.set_key(std::move(key));
    request.set_value(std::move(value));
    request.set_lease(lease);
    auto start = [kv = stubs().kv.get()](auto* ctx, const auto& req, auto* queue) {
      return kv->PrepareAsyncPut(ctx, req, queue);
    };
    auto response = co_await unary<pb::PutResponse>(std::move(request), start);
    if (!response) co_return response.error();
    co_return response->header().revision();
  }

  awaitable<result<int64_t>> erase(std::string key, std::string range_end) override {
    pb::DeleteRangeRequest request;
    request.set_key(std::move(key));
    request.set_range_end(std::move(range_end));
    auto start = [kv = stubs().kv.get()](auto* ctx, const auto& req, auto* queue) {
      return kv->PrepareAsyncDeleteRange(ctx, req, queue);
    };
    auto response = co_await unary<pb::DeleteRangeResponse>(std::move(request), start);
    if (!response) co_return response.error();
    co_return response->deleted();
  }

  // Transactions asked for while one is on its way wait for it, then go together as one
  // request (TxnNest says which may): reads side by side in one read-only transaction, others
  // as nested transactions, each still decided by its own compares. etcd then orders,
  // replicates and applies one entry for all of them, or makes one read of them all. One
  // asked for alone goes at once.
  awaitable<result<TxnResult>> txn(std::vector<EtcdCompare> compare, std::vector<EtcdOp> success,
                                   std::vector<EtcdOp> failure) override {
    auto waiting = make_waiting_txn(compare, success, failure);
    auto response = co_await queue_txn(std::move(waiting));
    if (!response) co_return response.error();
    co_return from_pb(*response);
  }

  awaitable<result<int64_t>> lease_grant(int64_t ttl_seconds) override {
    pb::LeaseGrantRequest request;
    request.set_ttl(ttl_seconds);
    auto start = [lease = stubs().lease.get()](auto* ctx, const auto& req, auto* queue) {
      return lease->PrepareAsyncLeaseGrant(ctx, req, queue);
    };
    auto response = co_await unary<pb::LeaseGrantResponse>(std::move(request), start);
    if (!response) co_return response.error();
    if (!response->error().empty()) co_return Error(errc::etcd_error, response->error());
    co_return response->id();
  }

  awaitable<result<void>> lease_revoke(int64_t id) override {
    pb::LeaseRevokeRequest request;
    request.set_id(id);
    auto start = [lease = stubs().lease.get()](auto* ctx, const auto& req, auto* queue) {
      return lease->PrepareAsyncLeaseRevoke(ctx, req, queue);
    };
    auto response = co_await unary<pb::LeaseRevokeResponse>(std::move(request), start);
    if (!response) co_return response.error();
    co_return result<void>{};
  }

  std::unique_ptr<EtcdLeaseKeeper> keep_alive(int64_t id) override { return keep_alives_->open(id, {}); }

  std::unique_ptr<EtcdWatch> watch(WatchOptions options) override {
    return watches_.open(*stubs().watch, token_, options);
  }

  awaitable<result<void>> user_add(std::string name, std::string password) override {
    pb::AuthUserAddRequest request;
    request.set_name(name);
    if (password.empty()) {
      request.mutable_options()->set_no_password(true);
    } else {
      request.set_password(password);
    }
    co_return co_await auth_call<pb::AuthUserAddResponse>(std::move(request), &pb::Auth::Stub::PrepareAsyncUserAdd);
  }

  awaitable<result<std::vector<std::string>>> user_roles(std::string name) override {
    pb::AuthUserGetRequest request;
    request.set_name(name);
    auto start = [auth = stubs().auth.get()](auto* ctx, const auto& req, auto* queue) {
      return auth->PrepareAsyncUserGet(ctx, req, queue);
    };
    auto response = co_await unary<pb::AuthUserGetResponse>(std::move(request), start);
    if (!response) co_return auth_error(response.error());
    co_return std::vector<std::string>(response->roles().begin(), response->roles().end());
  }

  awaitable<result<void>> user_delete(std::string name) override {
    pb::AuthUserDeleteRequest request;
    request.set_name(name);
    co_return co_await auth_call<pb::AuthUserDeleteResponse>(std::move(request),
                                                             &pb::Auth::Stub::PrepareAsyncUserDelete);
  }

  awaitable<result<void>> user_grant_role(std::string name, std::string role) override {
    pb::AuthUserGrantRoleRequest request;
    request.set_user(name);
    request.set_role(role);
    co_return co_await auth_call<pb::AuthUserGrantRoleResponse>(std::move(request),
                                                                &pb::Auth::Stub::PrepareAsyncUserGrantRole);
  }

  awaitable<result<void>> user_revoke_role(std::string name, std::string role) override {
    pb::AuthUserRevokeRoleRequest request;
    request.set_name(name);
    request.set_role(role);
    co_return co_await auth_call<pb::AuthUserRevokeRoleResponse>(std::move(request),
                                                                 &pb::Auth::Stub::PrepareAsyncUserRevokeRole);
  }

  awaitable<result<void>> role_add(std::string name) override {
    pb::AuthRoleAddRequest request;
    request.set_name(name);
    co_return co_await auth_call<pb::AuthRoleAddResponse>(std::move(request), &pb::Auth::Stub::PrepareAsyncRoleAdd);
  }

  awaitable<result<std::vector<EtcdPermission>>> role_permissions(std::string name) override {
    pb::AuthRoleGetRequest request;
    request.set_role(name);
    auto start = [auth = stubs().auth.get()](auto* ctx, const auto& req, auto* queue) {
      return auth->PrepareAsyncRoleGet(ctx, req, queue);
    };
    auto response = co_await unary<pb::AuthRoleGetResponse>(std::move(request), start);
    if (!response) co_return auth_error(response.error());
    std::vector<EtcdPermission> out;
    for (const pb::Permission& p : response->perm())
      out.push_back({p.permtype() == pb::Permission::READ    ? EtcdPermission::Type::read
                     : p.permtype() == pb::Permission::WRITE ? EtcdPermission::Type::write
                                                             : EtcdPermission::Type::readwrite,
                     p.key(), p.range_end()});
    co_return out;
  }

  awaitable<result<void>> role_delete(std::string name) override {
    pb::AuthRoleDeleteRequest request;
    request.set_role(name);
    co_return co_await auth_call<pb::AuthRoleDeleteResponse>(std::move(request),
                                                             &pb::Auth::Stub::PrepareAsyncRoleDelete);
  }

  awaitable<result<void>> role_grant(std::string name, EtcdPermission permission) override {
    pb::AuthRoleGrantPermissionRequest request;
    request.set_name(name);
    pb::Permission* p = request.mutable_perm();
    p->set_permtype(permission.type == EtcdPermission::Type::read    ? pb::Permission::READ
                    : permission.type == EtcdPermission::Type::write ? pb::Permission::WRITE
                                                                     : pb::Permission::READWRITE);
    p->set_key(permission.key);
    p->set_range_end(permission.range_end);
    co_return co_await auth_call<pb::AuthRoleGrantPermissionResponse>(
        std::move(request), &pb::Auth::Stub::PrepareAsyncRoleGrantPermission);
  }

 private:
  // One unary call: gRPC completes it on the completion thread, the queue resumes us on
  // ours. With etcd auth, a token is fetched first, and fetched again once if etcd says it
  // expired.
  template <class Response, class Request, class StartFn>
  awaitable<result<Response>> unary(Request request, StartFn start) {
    for (int attempt = 0;; ++attempt) {
      if (!config_.password.empty() && token_.empty()) {
        if (auto authenticated = co_await authenticate(); !authenticated) co_return authenticated.error();
      }
      auto [status, response] = co_await call<Response>(request, start, token_);
      if (status.ok()) co_return std::move(response);
      if (!config_.password.empty() && attempt == 0 && status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        spdlog::info("etcd: {}; authenticating again", status.error_message());
        token_.clear();
        continue;
      }
      spdlog::debug("etcd {}: {}", endpoints_text_, status.error_message());
      co_return from_status(status);
    }
  }

  template <class Response, class Request, class StartFn>
  awaitable<std::pair<grpc::Status, Response>> call(const Request& request, StartFn& start, const std::string& token) {
    struct Call {
      grpc::ClientContext context;
      std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> rpc;  // gRPC uses it until Finish is done
      Response response;
      grpc::Status status;
      AsyncQueue<bool> done;
    };
    auto call = std::make_shared<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() + timeout_);
    if (!token.empty()) call->context.AddMetadata("token", token);
    const auto started = std::chrono::steady_clock::now();
    call->rpc = start(&call->context, request, completion_queue());  // the request is serialized here
    call->rpc->StartCall();
    call->rpc->Finish(&call->response, &call->status, on_completion([call](bool) { call->done.push(true); }));
    co_await call->done.async_pop();
    grpc::Status status = std::move(call->status);
    metrics::observe("toyvm_etcd_request_seconds",
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    metrics::count("toyvm_etcd_requests_total", {{"code", etcd_grpc::status_name(status.error_code())}});
    co_return std::pair{std::move(status), std::move(call->response)};
  }

  struct WaitingTxn {
    pb::TxnRequest request;
    TxnCost cost;
    std::vector<KeySpan> keys;
    bool reads_only = true;  // no compares, only range operations
    AsyncQueue<result<pb::TxnResponse>> answer;
  };

  // Reads and writes wait in lanes of their own, so that a read never waits for a write (a
  // schedule reads its candidates while its hold is written); each lane has one request on
  // its way at a time.
  struct TxnLane {
    std::deque<std::shared_ptr<WaitingTxn>> waiting;
    bool sending = false;  // a coroutine sends what waits
  };

  awaitable<result<pb::TxnResponse>> queue_txn(std::shared_ptr<WaitingTxn> waiting) {
    TxnLane& lane = waiting->reads_only ? reads_ : writes_;
    bool idle;
    {
      std::lock_guard lock(txns_mutex_);
      lane.waiting.push_back(waiting);
      idle = !lane.sending;
      lane.sending = true;
    }
    if (idle) {
      auto executor = co_await asio::this_coro::executor;
      asio::co_spawn(executor, send_waiting_txns(lane), asio::detached);
    }
    co_return co_await waiting->answer.async_pop();
  }

  static std::shared_ptr<WaitingTxn> make_waiting_txn(const std::vector<EtcdCompare>& compare,
                                                      const std::vector<EtcdOp>& success,
                                                      const std::vector<EtcdOp>& failure) {
    auto waiting = std::make_shared<WaitingTxn>();
    waiting->cost = TxnCost{compare.size(), std::max(success.size(), failure.size()), 0};
    waiting->reads_only = compare.empty() && failure.empty();
    for (const auto& cmp : compare) {
      to_pb(cmp, *waiting->request.add_compare());
      waiting->keys.push_back(KeySpan{cmp.key, {}});
      waiting->cost.bytes += cmp.key.size() + cmp.value.size() + 16;
    }
    auto add = [&](const EtcdOp& op, pb::RequestOp& out) {
      to_pb(op, out);
      const bool writes = op.kind != EtcdOp::Kind::range;
      waiting->keys.push_back(KeySpan{op.key, op.range_end, writes});
      waiting->reads_only = waiting->reads_only && !writes;
      waiting->cost.bytes += op.key.size() + op.value.size() + op.range_end.size() + 16;
    };
    for (const auto& op : success) add(op, *waiting->request.add_success());
    for (const auto& op : failure) add(op, *waiting->request.add_failure());
    return waiting;
  }

  awaitable<result<pb::TxnResponse>> send_txn(pb::TxnRequest request) {
    auto start = [kv = stubs().kv.get()](auto* ctx, const auto& req, auto* queue) {
      return kv->PrepareAsyncTxn(ctx, req, queue);
    };
    co_return co_await unary<pb::TxnResponse>(std::move(request), start);
  }

  awaitable<void> send_alone(std::shared_ptr<WaitingTxn> waiting) {
    auto response = co_await send_txn(waiting->request);
    waiting->answer.push(std::move(response));
  }

  // Sends what waits in `lane`, as much as may go together at a time, until nothing does.
  awaitable<void> send_waiting_txns(TxnLane& lane) {
    for (;;) {
      std::vector<std::shared_ptr<WaitingTxn>> batch;
      {
        std::lock_guard lock(txns_mutex_);
        TxnNest nest;
        while (!lane.waiting.empty() &&
               nest.take(lane.waiting.front()->cost, lane.waiting.front()->keys, lane.waiting.front()->reads_only)) {
          batch.push_back(std::move(lane.waiting.front()));
          lane.waiting.pop_front();
        }
        if (batch.empty()) {
          lane.sending = false;
          break;
        }
      }
      if (batch.size() == 1) {
        co_await send_alone(std::move(batch.front()));
        continue;
      }
      const bool reads = batch.front()->reads_only;
      pb::TxnRequest together;
      for (const auto& waiting : batch) {
        if (reads) together.mutable_success()->MergeFrom(waiting->request.success());
        else *together.add_success()->mutable_request_txn() = waiting->request;
      }
      const int answers = together.success_size();  // one per read, or one per transaction
      metrics::count("toyvm_etcd_txns_together_total", {}, double(batch.size()));
      auto response = co_await send_txn(std::move(together));
      if (response && response->responses_size() == answers) {
        int next = 0;
        for (const auto& waiting : batch) {
          pb::TxnResponse own;
          if (reads) {
            own.set_succeeded(true);
            for (int i = 0; i < waiting->request.success_size(); ++i)
              own.add_responses()->Swap(response->mutable_responses(next++));
          } else {
            own.Swap(response->mutable_responses(next++)->mutable_response_txn());
          }
          *own.mutable_header() = response->header();
          waiting->answer.push(std::move(own));
        }
      } else if (!response && (response.error().code == errc::etcd_error ||
                               response.error().code == errc::permission_denied)) {
        // Refused whole, so none was made (a lease one of them named is gone, a key one may
        // not write): each alone gets its own answer.
        std::vector<awaitable<void>> alone;
        for (auto& waiting : batch) alone.push_back(send_alone(std::move(waiting)));
        co_await run_together(std::move(alone));
      } else {
        // Not answered (so perhaps made), as each alone would have been.
        const Error error = response ? Error(errc::etcd_error, "etcd answered a request of several "
                                                               "transactions with another number of answers")
                                     : response.error();
        for (auto& waiting : batch) waiting->answer.push(error);
      }
    }
  }

  // etcd says what exists already, or is missing, in words; they become codes here.
  static Error auth_error(Error e) {
    const std::string text = e.message();
    if (text.find("already exists") != std::string::npos) return Error(errc::already_exists, e.detail);
    if (text.find("not found") != std::string::npos || text.find("not granted") != std::string::npos)
      return Error(errc::not_found, e.detail);
    return e;
  }

  template <class Response, class Request, class Prepare>
  awaitable<result<void>> auth_call(Request request, Prepare prepare) {
    auto start = [auth = stubs().auth.get(), prepare](auto* ctx, const auto& req, auto* queue) {
      return (auth->*prepare)(ctx, req, queue);
    };
    auto response = co_await unary<Response>(std::move(request), start);
    if (!response) co_return auth_error(response.error());
    co_return result<void>{};
  }

  // Where leases are renewed. A long-lived client (EtcdConfig::keepalive) renews them through
  // etcd's leader when a configured endpoint is the leader's: a follower would send each
  // renewal on to the leader as a request of its own (at ten thousand hosts, a quarter of what
  // etcd does at rest). It looks for the leader at its first renewal, again once the renewals'
  // answers carry a new raft term (an election) or a renewal stream failed (it renews through
  // the channel's member meanwhile), and every few minutes; at most every few seconds.
  etcd_grpc::KeepAliveStreams::Way renewal_way(const asio::any_io_executor& executor) {
    if (config_.keepalive) {
      const etcd_grpc::RenewalNews& news = keep_alives_->news();
      const uint64_t failures = news.failures;
      if (failures > leader_failures_) renew_through_ = nullptr;
      const auto now = std::chrono::steady_clock::now();
      const bool due = leader_found_at_ == std::chrono::steady_clock::time_point{} || news.term > leader_term_ ||
                       failures > leader_failures_ || now - leader_found_at_ > leader_recheck;
      if (due && executor && !finding_leader_ && now - leader_asked_at_ >= leader_ask_pause) {
        finding_leader_ = true;
        leader_asked_at_ = now;
        asio::co_spawn(executor, find_leader(shared_from_this(), failures), asio::detached);
      }
    }
    return {renew_through_ ? renew_through_ : stubs().lease.get(), token_};
  }

  // `self` keeps the client while its requests are on their way.
  awaitable<void> find_leader([[maybe_unused]] std::shared_ptr<GrpcEtcdClient> self, uint64_t failures) {
    struct Finding {  // over also when its event loop ends first
      bool& flag;
      ~Finding() { flag = false; }
    } finding{finding_leader_};
    auto found = co_await leader_endpoint();
    if (!found) {
      spdlog::debug("etcd: looking for the leader to renew leases through: {}", found.error().message());
      co_return;
    }
    leader_found_at_ = std::chrono::steady_clock::now();
    leader_term_ = found->term;
    leader_failures_ = failures;
    pb::Lease::Stub* through = nullptr;
    if (!found->endpoint.empty()) {
      Leader& leader = leaders_[found->endpoint];
      if (!leader.lease) {
        EtcdConfig one = config_;
        one.endpoints = {found->endpoint};
        leader.channel = etcd_grpc::make_channel(one);
        leader.lease = pb::Lease::NewStub(leader.channel);
      }
      through = leader.lease.get();
    }
    if (through != renew_through_)
      spdlog::info("etcd: renewing leases through {}", found->endpoint.empty() ? "the members the client reaches"
                                                                               : "the leader at " + found->endpoint);
    renew_through_ = through;
  }

  struct LeaderFound {
    std::string endpoint;  // the configured endpoint that is the leader's; empty: none is
    uint64_t term = 0;
  };
  awaitable<result<LeaderFound>> leader_endpoint() {
    auto status_start = [maintenance = stubs().maintenance.get()](auto* ctx, const auto& req, auto* queue) {
      return maintenance->PrepareAsyncStatus(ctx, req, queue);
    };
    pb::StatusRequest status_request;
    auto status = co_await unary<pb::StatusResponse>(std::move(status_request), status_start);
    if (!status) co_return status.error();
    LeaderFound found{{}, status->raftterm()};
    if (status->leader() == 0) co_return Error(errc::etcd_unavailable, "etcd has no leader");
    auto members_start = [cluster = stubs().cluster.get()](auto* ctx, const auto& req, auto* queue) {
      return cluster->PrepareAsyncMemberList(ctx, req, queue);
    };
    pb::MemberListRequest members_request;
    auto members = co_await unary<pb::MemberListResponse>(std::move(members_request), members_start);
    if (!members) co_return members.error();
    auto trimmed = [](std::string url) {
      while (url.ends_with('/')) url.pop_back();
      return url;
    };
    for (const pb::Member& member : members->members()) {
      if (member.id() != status->leader()) continue;
      for (const std::string& url : member.clienturls())
        for (const std::string& endpoint : config_.endpoints)
          if (trimmed(url) == trimmed(endpoint)) found.endpoint = endpoint;
    }
    co_return found;
  }

  awaitable<result<void>> authenticate() {
    pb::AuthenticateRequest request;
    request.set_name(config_.user);
    request.set_password(config_.password);
    auto start = [auth = stubs().auth.get()](auto* ctx, const auto& req, auto* queue) {
      return auth->PrepareAsyncAuthenticate(ctx, req, queue);
    };
    auto [status, response] = co_await call<pb::AuthenticateResponse>(request, start, "");
    if (!status.ok()) {
      const errc code = status.error_code() == grpc::StatusCode::UNAVAILABLE ? errc::etcd_unavailable : errc::etcd_error;
      co_return Error(code, fmt::format("authenticating as {}: {}", config_.user, status.error_message()));
    }
    token_ = response.token();
    co_return result<void>{};
  }

  std::string endpoints_text_;
  std::chrono::milliseconds timeout_;
  std::mutex txns_mutex_;
  TxnLane reads_, writes_;
  std::string token_;  // from Authenticate; used and renewed on the event loop's thread
  etcd_grpc::WatchStreams watches_;
  std::shared_ptr<etcd_grpc::KeepAliveStreams> keep_alives_;
  // The leader renewals go through (renewal_way), on the event loop's thread.
  static constexpr std::chrono::minutes leader_recheck{5};
  static constexpr std::chrono::seconds leader_ask_pause{5};
  struct Leader {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::Lease::Stub> lease;
  };
  std::map<std::string, Leader> leaders_;  // by endpoint
  pb::Lease::Stub* renew_through_ = nullptr;  // null: the channel's member
  std::chrono::steady_clock::time_point leader_found_at_{}, leader_asked_at_{};
  uint64_t leader_term_ = 0, leader_failures_ = 0;
  bool finding_leader_ = false;
  // The channel is made at the first call, not with the client: gRPC's start (its library,
  // its threads, the connection) then overlaps what a command asks of Placement first.
  struct Stubs {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Watch::Stub> watch;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Auth::Stub> auth;
    std::unique_ptr<pb::Maintenance::Stub> maintenance;
    std::unique_ptr<pb::Cluster::Stub> cluster;
  };
  Stubs& stubs() {
    std::call_once(made_, [this] {
      stubs_.channel = etcd_grpc::make_channel(config_);
      stubs_.kv = pb::KV::NewStub(stubs_.channel);
      stubs_.watch = pb::Watch::NewStub(stubs_.channel);
      stubs_.lease = pb::Lease::NewStub(stubs_.channel);
      stubs_.auth = pb::Auth::NewStub(stubs_.channel);
      stubs_.maintenance = pb::Maintenance::NewStub(stubs_.channel);
      stubs_.cluster = pb::Cluster::NewStub(stubs_.channel);
    });
    return stubs_;
  }
  EtcdConfig config_;
  std::once_flag made_;
  Stubs stubs_;
};

}  // namespace

namespace {
Error no_auth_api() { return Error(errc::etcd_error, "this etcd client has no Auth API"); }
}  // namespace

awaitable<result<void>> EtcdClient::user_add(std::string, std::string) { co_return no_auth_api(); }
awaitable<result<std::vector<std::string>>> EtcdClient::user_roles(std::string) { co_return no_auth_api(); }
awaitable<result<void>> EtcdClient::user_delete(std::string) { co_return no_auth_api(); }
awaitable<result<void>> EtcdClient::user_grant_role(std::string, std::string) { co_return no_auth_api(); }
awaitable<result<void>> EtcdClient::user_revoke_role(std::string, std::string) { co_return no_auth_api(); }
awaitable<result<void>> EtcdClient::role_add(std::string) { co_return no_auth_api(); }
awaitable<result<std::vector<EtcdPermission>>> EtcdClient::role_permissions(std::string) { co_return no_auth_api(); }
awaitable<result<void>> EtcdClient::role_delete(std::string) { co_return no_auth_api(); }
awaitable<result<void>> EtcdClient::role_grant(std::string, EtcdPermission) { co_return no_auth_api(); }

std::chrono::milliseconds lease_renewal_interval(std::chrono::milliseconds ttl) {
  // A stalled member is noticed within a ping and its timeout; a second more to reach
  // another member and renew there.
  const std::chrono::milliseconds stall = etcd_ping_interval + etcd_ping_timeout + std::chrono::seconds(1);
  return std::clamp(ttl - stall, ttl / 3, ttl / 2);
}

awaitable<result<RangeResult>> EtcdClient::range_prefix(std::string prefix) {
  std::string end = prefix_range_end(prefix);
  co_return co_await range(std::move(prefix), std::move(end));
}

namespace {
// gRPC logs its own errors (a failed TLS handshake, say) to stderr; toyvm reports failures
// itself in one line, so gRPC's lines go to the debug log.
void forward_grpc_log(gpr_log_func_args* args) { spdlog::debug("grpc: {}", args->message); }
}  // namespace

std::shared_ptr<EtcdClient> EtcdClient::create(const EtcdConfig& config) {
  static std::once_flag once;
  std::call_once(once, [] {
    gpr_set_log_function(forward_grpc_log);
    // Debian builds abseil without NDEBUG, so every absl::Mutex that gRPC locks also updates a
    // global lock-order graph (3.5% of one `toyvm schedule`'s instructions, callgrind).
    // A release build of abseil does not track it; neither do we.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
  return std::make_shared<GrpcEtcdClient>(config);
}

}  // namespace toyvm
