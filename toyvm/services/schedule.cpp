// toyvm schedule: claims resources in Placement and hands the instance to the chosen host
// through etcd. The claim is the commitment; the etcd write is create-only, and if it cannot
// be made the claim is released, so a failed schedule leaves nothing behind. While it runs, a
// key per instance under its lease says its claims are still on their way (`audit --fix`
// leaves them alone); the hand-over requires those keys, so once they lapse it cannot happen.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "core/failpoint.hpp"
#include "model/groups.hpp"
#include "model/image.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "model/txn_limits.hpp"
#include "model/uuid.hpp"
#include "services/common.hpp"
#include "services/placer.hpp"
#include "services/services.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>
#include <fstream>
#include <optional>
#include <random>
#include <set>

namespace toyvm {
namespace {

using namespace asio::experimental::awaitable_operators;

// Nova's limit on user data; etcd's on a request is 1.5 MiB.
constexpr size_t max_user_data = 64 * 1024;
// How long a schedule's hold on its claims outlives it (killed, or cut off from etcd).
constexpr int64_t claim_hold_ttl_s = 10;

std::optional<std::string> read_small_file(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string data(limit + 1, '\0');
  in.read(data.data(), std::streamsize(data.size()));
  data.resize(size_t(in.gcount()));
  return data;
}

// The image, user data and ssh keys from the command line, checked before anything is claimed.
result<void> read_guest_data(const ScheduleOptions& options, WorkSpec& spec, std::string* detail) {
  // The syntax only: which schemes are allowed, and whether the image exists, is each agent's call.
  if (!options.image.empty()) {
    auto image = parse_image_ref(options.image, {"http", "https", "file"}, detail);
    if (!image) return image.error();
  }
  if (!options.image_sha256.empty() && !is_sha256_hex(options.image_sha256)) {
    *detail = "--image-sha256 must be 64 lowercase hex digits";
    return errc::invalid_argument;
  }
  if (!options.user_data_file.empty()) {
    auto data = read_small_file(options.user_data_file, max_user_data);
    if (!data) {
      *detail = fmt::format("cannot read user data file {}", options.user_data_file);
      return errc::invalid_argument;
    }
    if (data->size() > max_user_data) {
      *detail = fmt::format("user data file {} is larger than {} bytes", options.user_data_file, max_user_data);
      return errc::invalid_argument;
    }
    spec.user_data = std::move(*data);
  }
  for (const std::string& key : options.keys) {
    size_t eq = key.find('=');
    if (eq == 0 || eq == std::string::npos || key.find('\n') != std::string::npos) {
      *detail = fmt::format("bad --key '{}' (expected NAME=PUBKEY)", key.substr(0, 40));
      return errc::invalid_argument;
    }
    spec.keys.emplace_back(key.substr(0, eq), key.substr(eq + 1));
  }
  for (const std::string& file : options.key_files) {
    auto text = read_small_file(file, 16 * 1024);
    if (!text || text->size() > 16 * 1024) {
      *detail = fmt::format("cannot read ssh public key file {}", file);
      return errc::invalid_argument;
    }
    std::string line = text->substr(0, text->find('\n'));
    // "type base64 comment": the comment names the key, else the file does.
    size_t first = line.find(' ');
    size_t second = first == std::string::npos ? first : line.find(' ', first + 1);
    if (first == std::string::npos) {
      *detail = fmt::format("{} is not an OpenSSH public key", file);
      return errc::invalid_argument;
    }
    std::string name = second == std::string::npos ? std::filesystem::path(file).stem().string()
                                                   : line.substr(second + 1);
    spec.keys.emplace_back(name, line);
  }
  return {};
}

class Scheduler {
 public:
  Scheduler(asio::io_context& io, const Config& config, const ScheduleOptions& options)
      : io_(io),
        config_(config),
        options_(options),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        placement_(io.get_executor(), config.placement),
        placer_(placement_, *etcd_, config),
        // Checked on the command line to be one of the three.
        group_policy_(options.group.empty() ? std::nullopt : parse_group_policy(options.group_policy)) {}

  awaitable<int> run() {
    std::string detail;
    auto query = parse_placement_query(options_.query, &detail);
    if (!query) co_return report_failure(query.error(), "invalid query: " + detail);
    if (!options_.group.empty() && !is_group_name(options_.group))
      co_return report_failure(errc::invalid_argument,
                               fmt::format("bad group name '{}' (1 to 64 of A-Z a-z 0-9 _ . -)", options_.group));
    if (!options_.availability_zone.empty())
      query->params.emplace_back("member_of", availability_zone_aggregate(options_.availability_zone));
    WorkSpec spec;
    if (auto read = read_guest_data(options_, spec, &detail); !read)
      co_return report_failure(read.error(), detail);
    // Checked before anything is claimed: an instance etcd cannot take in one request could
    // never be handed over, and its claim would only have to be given back.
    const int count = std::max(1, options_.count);
    const Placed biggest = instance(spec, new_uuid(), count - 1, new_uuid(), {});  // its host not known yet
    if (const TxnCost one = hand_over_cost(biggest.work, biggest.record); !split_by_limits({one}))
      co_return report_failure(errc::invalid_argument,
                               fmt::format("the instance's data ({} bytes with its user data and keys) is more than "
                                           "etcd takes in one request ({} bytes)", one.bytes, etcd_request_budget));

    std::vector<std::string> uuids(static_cast<size_t>(count));
    for (std::string& uuid : uuids) uuid = new_uuid();
    auto placed = co_await (place(std::move(*query), std::move(spec), std::move(uuids)) || keep_holding());
    co_return std::get<0>(placed);
  }

 private:
  awaitable<int> place(PlacementQuery query, WorkSpec spec, std::vector<std::string> uuids) {
    const int count = int(uuids.size());
    uuids_ = uuids;
    result<std::vector<Claim>> claims = make_error_code(errc::no_allocations_left);
    if (count == 1) {
      claims = co_await claim_one(std::move(query), uuids.front());
    } else {
      claims = co_await claim_batch(std::move(query), uuids);
    }
    if (!claims) {
      co_await let_go();
      if (claims.error() == errc::no_allocations_left) {
        std::printf("NO ALLOCATIONS LEFT\n");
        co_return static_cast<int>(ExitCode::no_allocations);
      }
      if (!group_clash_.empty()) co_return report_failure(claims.error(), group_clash_);
      if (is_etcd_error(claims.error())) co_return etcd_failure(claims.error());
      // What Placement said, before the releases below have their say.
      const PlacementError said = placement_.last_error();
      if (claiming_) co_await release_all(uuids);  // a claim whose answer was lost may have been made
      co_return placement_failure(claims.error(), said);
    }
    spdlog::debug("schedule: claimed {} instance(s)", count);

    std::vector<WorkSpec> specs;
    std::vector<InstanceRecord> records;
    for (int i = 0; i < count; ++i) {
      const Claim& claim = (*claims)[size_t(i)];
      Placed one = instance(spec, uuids[size_t(i)], i, claim.host, claim.allocations.at(claim.host));
      specs.push_back(std::move(one.work));
      records.push_back(std::move(one.record));
    }
    co_await failpoint::pass("schedule.hand_over");  // claimed, not yet handed over
    HandOver handed = co_await hand_over(specs, records);
    if (handed.error) {
      co_await let_go();  // nothing more of this schedule's is on its way
      co_return co_await give_up_hand_over(handed, uuids, specs, records);
    }
    // Its keys went with the hand-over; the lease, now holding nothing, runs out by itself.
    hold_lease_ = 0;
    spdlog::debug("schedule: handed over through etcd");
    for (const InstanceRecord& record : records)
      std::printf("NOTIFIED TARGET, %s, OF INSTANCE %s\n", record.host.c_str(), record.uuid.c_str());
    std::fflush(stdout);
    if (!options_.wait) co_return 0;
    int worst = 0;  // a failure outranks an instance that is only missing its address
    for (const std::string& uuid : uuids) {
      int code = co_await wait_until_settled(uuid, handed.revision);
      if (code != 0 && (worst == 0 || worst == int(ExitCode::no_address))) worst = code;
    }
    co_return worst;
  }

  // Before anything is claimed: a key per instance, under a lease of this schedule's.
  awaitable<result<void>> hold_claims() {
    auto lease = co_await etcd_->lease_grant(claim_hold_ttl_s);
    if (!lease) co_return lease.error();
    hold_lease_ = *lease;
    std::vector<TxnCost> costs(uuids_.size(), TxnCost{0, 1, keys_.claim(uuids_.front()).size()});
    size_t first = 0;
    for (const size_t end : split_by_limits(costs).value_or(std::vector<size_t>{})) {
      std::vector<EtcdOp> puts;
      for (size_t i = first; i < end; ++i) puts.push_back(EtcdOp::put(keys_.claim(uuids_[i]), "", *lease));
      auto put = co_await etcd_->txn({}, std::move(puts));
      if (!put) co_return put.error();
      first = end;
    }
    co_return result<void>{};
  }

  // Renews the hold while the schedule runs; never ends by itself. A hold that lapsed is not
  // put again: audit may have given its claims back meanwhile.
  awaitable<void> keep_holding() {
    asio::steady_timer timer(io_);
    std::unique_ptr<EtcdLeaseKeeper> keeper;
    while (true) {
      timer.expires_after(std::chrono::seconds(claim_hold_ttl_s) / 3);
      co_await timer.async_wait(use_awaitable);
      if (!hold_lease_) continue;
      if (!keeper) keeper = etcd_->keep_alive(hold_lease_);
      auto ttl = co_await keeper->ping();
      if (!ttl || *ttl == 0) keeper.reset();
    }
  }

  awaitable<void> let_go() {
    if (const int64_t lease = std::exchange(hold_lease_, 0)) co_await etcd_->lease_revoke(lease);
  }

  // The first look and the hold go out together: neither waits for the other.
  awaitable<result<PlacementView>> first_look(PlacementQuery query, int limit) {
    auto [view, held] = co_await (look(std::move(query), limit) && hold_claims());
    if (!held) co_return held.error();
    co_return std::move(view);
  }

  // Candidates, live hosts and the group's members, with the group's policy checked.
  awaitable<result<PlacementView>> look(PlacementQuery query, int limit) {
    spdlog::debug("schedule: asking Placement and etcd");
    auto view = co_await placer_.look(std::move(query), options_.group, {}, limit);
    if (!view) co_return view.error();
    for (GroupPolicy policy : view->group_policies) {
      if (policy != group_policy()) {
        group_clash_ = fmt::format("server group {} has policy {}, not {}", options_.group, to_string(policy),
                                   options_.group_policy);
        co_return make_error_code(errc::invalid_argument);
      }
    }
    spdlog::debug("schedule: {} candidates, {} live hosts", view->candidates.allocation_requests.size(),
                  view->live.size());
    co_return view;
  }

  std::optional<GroupPolicy> group_policy() const { return group_policy_; }

  // One instance: the weighed candidates tried in turn.
  awaitable<result<std::vector<Claim>>> claim_one(PlacementQuery query, std::string uuid) {
    auto view = co_await first_look(std::move(query), 0);
    if (!view) co_return view.error();
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::mt19937_64 rng{random_seed()};
    auto ranked = placer_.rank(*view, placer_.weigh_policy(options_.policy), uniform(rng), group_policy());
    claiming_ = true;
    auto claim = co_await placer_.claim_first_fit(uuid, std::move(ranked));
    if (!claim) co_return claim.error();
    co_return std::vector<Claim>{std::move(*claim)};
  }

  // A batch: planned against the free capacity Placement shows, then claimed in one request
  // (all or nothing). When the plan does not fit in the candidates shown, more are asked
  // for; when another claim got in first, Placement is asked again and the batch re-planned.
  // Of batches that compete, the first to reach Placement wins: none undoes another's work.
  awaitable<result<std::vector<Claim>>> claim_batch(PlacementQuery query, const std::vector<std::string>& uuids) {
    const bool own_limit = query.limit > 0;
    int limit = std::max<int>(config_.placement.candidate_limit, int(uuids.size()));
    std::mt19937_64 rng{random_seed()};
    for (int round = 1;; ++round) {
      result<PlacementView> view = make_error_code(errc::no_allocations_left);
      if (round == 1) {
        view = co_await first_look(query, limit);
      } else {
        view = co_await look(query, limit);
      }
      if (!view) co_return view.error();
      const bool truncated = !own_limit && view->candidates.allocation_requests.size() >= size_t(limit);
      auto plan = plan_batch(std::move(*view), uuids.size(), rng);
      if (!plan) {
        if (!truncated) co_return make_error_code(errc::no_allocations_left);
        limit *= 4;  // the rest of the cloud may have room
        continue;
      }
      std::vector<std::pair<std::string, Allocations>> consumers;
      for (size_t i = 0; i < uuids.size(); ++i) consumers.emplace_back(uuids[i], (*plan)[i].allocations);
      claiming_ = true;
      auto claimed = co_await placement_.claim_all(std::move(consumers));
      if (claimed) co_return std::move(*plan);
      const bool raced = claimed.error() == errc::placement_capacity ||
                         claimed.error() == errc::placement_concurrent_update;
      if (!raced || round >= config_.schedule.max_claim_attempts * 4) co_return claimed.error();
      spdlog::debug("schedule: another claim came first ({}); planning again", placement_.last_error().detail);
      // Apart, so that batches racing for the same room do not meet again at once.
      std::uniform_int_distribution<int> jitter(0, 20 * std::min(round, 10));
      asio::steady_timer timer(io_, std::chrono::milliseconds(jitter(rng)));
      co_await timer.async_wait(use_awaitable);
    }
  }

  // Where each instance of a batch goes, planned against a local copy of the free capacity,
  // so that they spread (or pack) before they reach Placement instead of all colliding on
  // the best host. Nothing when one of them fits nowhere.
  std::optional<std::vector<Claim>> plan_batch(PlacementView view, size_t count, std::mt19937_64& rng) {
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    WeighPolicy policy = placer_.weigh_policy(options_.policy);
    std::vector<Claim> plan;
    for (size_t i = 0; i < count; ++i) {
      std::vector<Choice> ranked = placer_.rank(view, policy, uniform(rng), group_policy());
      auto fits = [&](const Choice& choice) {
        for (auto& [rp, resources] : *choice.allocations) {
          auto summary = view.candidates.provider_summaries.find(rp);
          if (summary == view.candidates.provider_summaries.end()) continue;
          for (auto& [rc, amount] : resources) {
            auto capacity = summary->second.capacity.find(rc);
            if (capacity != summary->second.capacity.end() && summary->second.used[rc] + amount > capacity->second)
              return false;
          }
        }
        return true;
      };
      auto first = std::find_if(ranked.begin(), ranked.end(), fits);
      if (first == ranked.end()) return std::nullopt;
      for (auto& [rp, resources] : *first->allocations)
        for (auto& [rc, amount] : resources) view.candidates.provider_summaries[rp].used[rc] += amount;
      view.group_members[first->host] += 1;  // later instances of the batch see it
      plan.push_back(Claim{first->host, *first->allocations});
    }
    return plan;
  }

  awaitable<void> release_all(const std::vector<std::string>& uuids) {
    for (const std::string& uuid : uuids) {
      if (!co_await placement_.release(uuid))
        spdlog::error("releasing allocation {}: {}", uuid, placement_.last_error().detail);
    }
  }

  // What a hand-over did: the revision of its last write, or how far it got.
  struct HandOver {
    int64_t revision = 0;
    size_t handed = 0;     // the first `handed` instances are in etcd
    size_t in_doubt = 0;   // the next ones may be: etcd did not say
    bool hold_lapsed = false;
    error_code error;
  };

  // What handing one instance over adds to a transaction: its work, record and group
  // membership, each compared absent and written; its hold, compared present and erased.
  TxnCost hand_over_cost(const WorkSpec& spec, const InstanceRecord& record) const {
    const std::string work = keys_.work(record.host, spec.uuid), instance = keys_.instance(spec.uuid);
    const std::string claim = keys_.claim(spec.uuid);
    TxnCost cost{3, 3, 2 * (work.size() + instance.size() + claim.size()) + encode(spec).size() + encode(record).size()};
    if (!spec.group.empty()) {
      constexpr size_t member_value = 128;  // host and policy
      cost.compares += 1;
      cost.ops += 1;
      cost.bytes += 2 * keys_.group_member(spec.group, spec.uuid).size() + member_value;
    }
    return cost;
  }

  // The `index`th instance of this schedule, as it is handed over: its work (the command
  // line's guest data in `guest`) and its first record.
  Placed instance(const WorkSpec& guest, std::string uuid, int index, std::string host, ResourceAmounts resources) const {
    Placed one{guest, {}};
    WorkSpec& work = one.work;
    work.uuid = std::move(uuid);
    work.name = options_.count <= 1 || options_.name.empty() ? options_.name
                                                             : fmt::format("{}-{}", options_.name, index + 1);
    work.image = options_.image.empty() ? config_.schedule.image : options_.image;
    work.image_sha256 = options_.image_sha256;
    work.image_format = options_.image_format;
    work.query = options_.query;
    work.resources = std::move(resources);
    work.config_drive = options_.config_drive;
    work.group = options_.group;
    work.group_policy = group_policy();
    work.created_at = unix_seconds();
    InstanceRecord& record = one.record;
    record.uuid = work.uuid;
    record.name = work.name;
    record.host = std::move(host);
    record.state = InstanceState::scheduled;
    record.updated_at = unix_millis();
    return one;
  }

  // Create-only transactions, as many instances each as etcd's limits on operations and
  // request size allow, each read back when etcd did not say whether it committed.
  awaitable<HandOver> hand_over(const std::vector<WorkSpec>& specs, const std::vector<InstanceRecord>& records) {
    HandOver out;
    std::vector<TxnCost> costs;
    for (size_t i = 0; i < specs.size(); ++i) costs.push_back(hand_over_cost(specs[i], records[i]));
    auto ends = split_by_limits(costs);
    if (!ends) {  // checked before claiming; a resource amount cannot make up the difference
      out.error = make_error_code(errc::invalid_argument);
      co_return out;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(config_.etcd.timeout_s * 3000));
    for (const size_t end : *ends) {
      const size_t first = out.handed;
      std::vector<Placed> placed;
      std::vector<EtcdCompare> absent;
      std::vector<EtcdOp> done;  // the hold on what is handed over
      for (size_t i = first; i < end; ++i) {
        placed.push_back(Placed{specs[i], records[i]});
        done.push_back(EtcdOp::erase(keys_.claim(specs[i].uuid)));
        absent.push_back(EtcdCompare::absent(keys_.work(records[i].host, specs[i].uuid)));
        absent.push_back(EtcdCompare::absent(keys_.instance(specs[i].uuid)));
        absent.push_back(EtcdCompare::present(keys_.claim(specs[i].uuid)));  // our hold stands
        if (!specs[i].group.empty()) absent.push_back(EtcdCompare::absent(keys_.group_member(specs[i].group, specs[i].uuid)));
      }
      HandOverResult txn = co_await placer_.hand_over(std::move(placed), std::move(absent), std::move(done), deadline);
      switch (txn.outcome) {
        case HandOverResult::Outcome::committed:
          out.revision = txn.revision;
          out.handed = end;
          break;
        case HandOverResult::Outcome::refused: {  // keys exist that are not ours, or our hold lapsed
          auto hold = co_await etcd_->range(keys_.claim(specs[first].uuid));
          out.hold_lapsed = hold && hold->kvs.empty();
          out.error = make_error_code(out.hold_lapsed ? errc::timeout : errc::already_exists);
          co_return out;
        }
        case HandOverResult::Outcome::unknown:
          out.in_doubt = end - first;
          out.error = txn.error;
          co_return out;
      }
    }
    co_return out;
  }

  // A batch is all or nothing: what was handed over is taken back while no agent has touched
  // it, and claims are released only for instances known not to be in etcd. An instance whose
  // fate etcd did not tell keeps its claim (`toyvm audit --fix` resolves it either way).
  awaitable<int> give_up_hand_over(HandOver handed, std::vector<std::string> uuids, std::vector<WorkSpec> specs,
                                   std::vector<InstanceRecord> records) {
    // Taken back in groups within etcd's limits, each only if no agent has touched it: the
    // first `undone` are out of etcd again, the rest of what was handed over is kept.
    size_t undone = 0;
    std::vector<TxnCost> costs;  // two compares and an erase of each of its keys
    for (size_t i = 0; i < handed.handed; ++i) {
      TxnCost cost{2, 0, 0};
      for (auto& [key, range_end] : keys_.instance_keys(records[i].host, specs[i].uuid, specs[i].group)) {
        cost.ops += 1;
        cost.bytes += 2 * key.size() + range_end.size();
      }
      costs.push_back(cost);
    }
    for (const size_t end : split_by_limits(costs).value_or(std::vector<size_t>{})) {
      std::vector<EtcdCompare> untouched;
      std::vector<EtcdOp> remove;
      for (size_t i = undone; i < end; ++i) {
        for (std::string key : {keys_.work(records[i].host, specs[i].uuid), keys_.instance(specs[i].uuid)})
          untouched.push_back(EtcdCompare{key, EtcdCompare::Target::version, EtcdCompare::Result::equal, 1, {}});
        for (auto& [key, range_end] : keys_.instance_keys(records[i].host, specs[i].uuid, specs[i].group))
          remove.push_back(EtcdOp::erase(key, range_end));
      }
      auto taken_back = co_await etcd_->txn(std::move(untouched), std::move(remove));
      if (!taken_back || !taken_back->succeeded) break;
      undone = end;
    }
    std::vector<std::string> release(uuids.begin(), uuids.begin() + long(undone));
    release.insert(release.end(), uuids.begin() + long(handed.handed + handed.in_doubt), uuids.end());
    co_await release_all(release);
    const size_t kept = handed.handed - undone;
    for (size_t i = undone; i < handed.handed; ++i)
      std::printf("NOTIFIED TARGET, %s, OF INSTANCE %s\n", records[i].host.c_str(), records[i].uuid.c_str());
    std::string what = handed.error == errc::already_exists ? "an instance key already exists"
                       : handed.hold_lapsed ? fmt::format("this schedule's hold on its claims lapsed (etcd out of reach "
                                                          "for more than {} s)", claim_hold_ttl_s)
                                            : handed.error.message();
    std::string detail = fmt::format("cannot hand the instance(s) over through etcd at {}: {}", etcd_->endpoints_text(), what);
    if (kept > 0) detail += fmt::format("; {} were handed over already and are kept", kept);
    if (handed.in_doubt > 0)
      detail += fmt::format("; {} may have been handed over, and keep their claims until `toyvm audit --fix`",
                            handed.in_doubt);
    co_return report_failure(handed.error, detail);
  }

  // Prints each state the instance reaches until it is settled; rides over a lost watch.
  awaitable<int> wait_until_settled(const std::string& uuid, int64_t since_revision) {
    std::optional<InstanceState> last;
    std::string last_ip;
    int code = 0;
    auto settled = [&](const WatchEvent& event) {
      if (event.type == WatchEvent::Type::erase) {
        code = report_failure(ExitCode::failed, fmt::format("instance {} was deleted", uuid));
        return true;
      }
      auto record = decode_instance(event.kv.value);
      // ERROR counts once its allocation is given back: then it holds nothing.
      if (!record || (record->state == InstanceState::error && record->releasing)) return false;
      if (record->state == InstanceState::active && record->ip.empty() && record->no_address) {
        if (last != InstanceState::active) std::printf("INSTANCE %s ACTIVE\n", uuid.c_str());
        code = report_failure(ExitCode::no_address,
                              fmt::format("instance {} is ACTIVE but its guest got no address within its "
                                          "host's address_timeout",
                                          uuid));
        return true;
      }
      if (record->state == last && record->ip == last_ip) return false;
      last = record->state;
      last_ip = record->ip;
      if (record->state == InstanceState::error) {
        std::printf("INSTANCE %s ERROR\n", uuid.c_str());
        code = report_failure(ExitCode::failed, fmt::format("instance {} failed: {}: {}", uuid, record->error_code,
                                                            record->error_message));
        return true;
      }
      std::printf("INSTANCE %s %s%s%s\n", uuid.c_str(), std::string(to_string(record->state)).c_str(),
                  record->ip.empty() ? "" : " ", record->ip.c_str());
      std::fflush(stdout);
      // A guest with a NIC is settled once its address is known too.
      return record->state == InstanceState::active && (record->mac.empty() || !record->ip.empty());
    };
    auto followed = co_await follow_key(*etcd_, keys_.instance(uuid), since_revision,
                                        std::chrono::milliseconds(int64_t(options_.wait_timeout_s * 1000)), settled);
    if (!followed) co_return etcd_failure(followed.error());
    if (*followed) co_return code;
    if (last == InstanceState::active)
      co_return report_failure(ExitCode::no_address,
                               fmt::format("instance {} is ACTIVE but has no address after {} s", uuid,
                                           options_.wait_timeout_s));
    co_return report_failure(ExitCode::failed,
                             fmt::format("instance {} did not settle within {} s", uuid, options_.wait_timeout_s));
  }

  int etcd_failure(const error_code& ec) { return toyvm::etcd_failure(*etcd_, ec); }

  int placement_failure(const error_code& ec, const PlacementError& said) {
    return toyvm::placement_failure(placement_, ec, said);
  }

  asio::io_context& io_;
  const Config& config_;
  const ScheduleOptions& options_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  PlacementClient placement_;
  Placer placer_;
  std::vector<std::string> uuids_;  // the instances of this schedule
  int64_t hold_lease_ = 0;          // the lease its claims are held under, while they are
  std::optional<GroupPolicy> group_policy_;  // with a group
  std::string group_clash_;  // why the group refused, when it did
  bool claiming_ = false;    // a claim went to Placement
};

}  // namespace

int run_schedule(const Config& config, const ScheduleOptions& options) {
  return run_on_loop([&](asio::io_context& io) -> awaitable<int> {
    Scheduler scheduler(io, config, options);
    co_return co_await scheduler.run();
  });
}

}  // namespace toyvm
