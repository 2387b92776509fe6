// toyvm schedule: claims resources in Placement and hands the instance to the chosen host
// through etcd. The claim is the commitment; the etcd write is create-only, and if it cannot
// be made the claim is released, so a failed schedule leaves nothing behind.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "model/uuid.hpp"
#include "services/common.hpp"
#include "services/services.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

namespace toyvm {
namespace {

using namespace asio::experimental::awaitable_operators;

// Nova's limit on user data; etcd's on a request is 1.5 MiB.
constexpr size_t max_user_data = 64 * 1024;

std::optional<std::string> read_small_file(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string data(limit + 1, '\0');
  in.read(data.data(), std::streamsize(data.size()));
  data.resize(size_t(in.gcount()));
  return data;
}

// User data and ssh keys from the command line, checked before anything is claimed.
result<void> read_guest_data(const ScheduleOptions& options, WorkSpec& spec, std::string* detail) {
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

struct Claim {
  std::string host;
  Allocations allocations;
};

class Scheduler {
 public:
  Scheduler(asio::io_context& io, const Config& config, const ScheduleOptions& options)
      : io_(io),
        config_(config),
        options_(options),
        keys_(config.etcd.prefix),
        etcd_(EtcdClient::create(config.etcd)),
        placement_(io.get_executor(), config.placement) {}

  awaitable<int> run() {
    std::string detail;
    auto query = parse_placement_query(options_.query, &detail);
    if (!query) co_return report_failure(query.error(), "invalid query: " + detail);
    WorkSpec spec;
    if (auto read = read_guest_data(options_, spec, &detail); !read)
      co_return report_failure(read.error(), detail);

    // Candidates and live hosts are independent: ask Placement and etcd at once.
    spdlog::debug("schedule: asking Placement and etcd");
    auto [candidates, hosts] = co_await (
        placement_.allocation_candidates(query->to_query_string(config_.placement.candidate_limit)) &&
        etcd_->range_prefix(keys_.hosts_prefix()));
    if (!hosts) co_return etcd_failure(hosts.error());
    if (!candidates) co_return placement_failure(candidates.error());

    std::set<std::string> live;
    for (const KeyValue& kv : hosts->kvs) {
      auto host = decode_host(kv.value);
      if (host && host->status == "READY") live.insert(host->provider);
    }

    spdlog::debug("schedule: {} candidates, {} live hosts", candidates->allocation_requests.size(), live.size());
    const std::string uuid = new_uuid();
    auto claim = co_await claim_first_fit(uuid, *candidates, live);
    if (!claim) {
      if (claim.error() == errc::no_allocations_left) {
        std::printf("NO ALLOCATIONS LEFT\n");
        co_return static_cast<int>(ExitCode::no_allocations);
      }
      co_return placement_failure(claim.error());
    }

    spec.uuid = uuid;
    spec.name = options_.name;
    spec.image = options_.image.empty() ? config_.schedule.image : options_.image;
    spec.query = options_.query;
    spec.resources = claim->allocations[claim->host];
    spec.created_at = unix_seconds();
    InstanceRecord record;
    record.uuid = uuid;
    record.name = options_.name;
    record.host = claim->host;
    record.state = InstanceState::scheduled;
    record.updated_at = unix_millis();

    spdlog::debug("schedule: claimed on {}", claim->host);
    const std::string work_key = keys_.work(claim->host, uuid);
    const std::string instance_key = keys_.instance(uuid);
    // Create-only: the instance exists exactly once or not at all. (Vectors built outside
    // co_await: GCC 12 miscompiles initializer lists inside it.)
    std::vector<EtcdCompare> absent{EtcdCompare::absent(work_key), EtcdCompare::absent(instance_key)};
    std::vector<EtcdOp> create{EtcdOp::put(work_key, encode(spec)), EtcdOp::put(instance_key, encode(record))};
    auto txn = co_await etcd_->txn(std::move(absent), std::move(create));
    if (!txn || !txn->succeeded) {
      auto released = co_await placement_.release(uuid);
      std::string what = txn ? "the instance key already exists" : txn.error().message();
      if (!released)
        what += fmt::format("; releasing allocation {} also failed: {}", uuid, placement_.last_error().detail);
      co_return report_failure(txn ? make_error_code(errc::already_exists) : txn.error(),
                               fmt::format("cannot hand instance {} to host {} through etcd at {}: {}",
                                           uuid, claim->host, etcd_->endpoints_text(), what));
    }
    spdlog::debug("schedule: handed over through etcd");
    std::printf("NOTIFIED TARGET, %s, OF INSTANCE %s\n", claim->host.c_str(), uuid.c_str());
    std::fflush(stdout);
    if (!options_.wait) co_return 0;
    co_return co_await wait_until_settled(uuid, txn->revision);
  }

 private:
  // Tries the candidates in order: a generation conflict retries the same one, a capacity
  // conflict moves on to the next.
  awaitable<result<Claim>> claim_first_fit(const std::string& uuid, const Candidates& candidates,
                                           const std::set<std::string>& live) {
    for (const Choice& choice : rank_candidates(candidates, live)) {
      for (int attempt = 1; attempt <= config_.schedule.max_claim_attempts; ++attempt) {
        auto claimed = co_await placement_.claim(uuid, *choice.allocations);
        if (claimed) co_return Claim{choice.host, *choice.allocations};
        if (claimed.error() == errc::placement_concurrent_update) continue;
        if (claimed.error() == errc::placement_capacity) break;
        co_return claimed.error();
      }
    }
    co_return make_error_code(errc::no_allocations_left);
  }

  awaitable<int> wait_until_settled(const std::string& uuid, int64_t since_revision) {
    const std::string key = keys_.instance(uuid);
    auto watch = etcd_->watch(WatchOptions{key, {}, since_revision, false});
    // The deadline ends the watch; next() then returns a cancelled batch.
    bool timed_out = false;
    asio::steady_timer deadline(io_, std::chrono::milliseconds(int64_t(options_.wait_timeout_s * 1000)));
    deadline.async_wait([&](const error_code& ec) {
      if (ec) return;
      timed_out = true;
      watch->cancel();
    });
    std::optional<InstanceState> last;
    while (true) {
      WatchBatch batch = co_await watch->next();
      if (timed_out) {
        co_return report_failure(ExitCode::failed,
                                 fmt::format("instance {} did not settle within {} s", uuid, options_.wait_timeout_s));
      }
      if (batch.error || batch.canceled) co_return etcd_failure(batch.error ? batch.error : make_error_code(errc::etcd_error));
      for (const WatchEvent& event : batch.events) {
        if (event.type == WatchEvent::Type::erase) {
          co_return report_failure(ExitCode::failed, fmt::format("instance {} was deleted", uuid));
        }
        auto record = decode_instance(event.kv.value);
        if (!record || record->state == last) continue;
        last = record->state;
        if (record->state == InstanceState::error) {
          std::printf("INSTANCE %s ERROR\n", uuid.c_str());
          co_return report_failure(ExitCode::failed, fmt::format("instance {} failed: {}: {}", uuid,
                                                                 record->error_code, record->error_message));
        }
        std::printf("INSTANCE %s %s%s%s\n", uuid.c_str(), std::string(to_string(record->state)).c_str(),
                    record->ip.empty() ? "" : " ", record->ip.c_str());
        std::fflush(stdout);
        if (record->state == InstanceState::active) co_return 0;
      }
    }
  }

  int etcd_failure(const error_code& ec) {
    return report_failure(ec, fmt::format("etcd at {}: {}", etcd_->endpoints_text(), ec.message()));
  }

  int placement_failure(const error_code& ec) {
    const PlacementError& error = placement_.last_error();
    std::string detail = error.detail.empty() ? ec.message() : error.detail;
    if (ec == errc::placement_unavailable) return report_failure(ec, detail);
    return report_failure(ec, fmt::format("Placement at {}: {}", placement_.endpoint(), detail));
  }

  asio::io_context& io_;
  const Config& config_;
  const ScheduleOptions& options_;
  KeyLayout keys_;
  std::shared_ptr<EtcdClient> etcd_;
  PlacementClient placement_;
};

}  // namespace

int run_schedule(const Config& config, const ScheduleOptions& options) {
  return run_on_loop([&](asio::io_context& io) -> awaitable<int> {
    Scheduler scheduler(io, config, options);
    co_return co_await scheduler.run();
  });
}

}  // namespace toyvm
