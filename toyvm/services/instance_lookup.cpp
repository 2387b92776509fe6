#include "services/instance_lookup.hpp"

#include "model/uuid.hpp"
#include "core/backoff.hpp"
#include "services/common.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>

namespace toyvm {

awaitable<result<FoundInstance>> find_instance(EtcdClient& etcd, const KeyLayout& keys, const std::string& uuid) {
  auto found = co_await etcd.range(keys.instance(uuid));
  if (!found) co_return etcd_error(etcd, found.error());
  if (found->kvs.empty()) co_return Error(errc::not_found, fmt::format("no instance {}", uuid));
  auto record = decode_instance(found->kvs.front().value);
  if (!record || !is_uuid(record->host))
    co_return Error(errc::corrupt_record, fmt::format("instance {} has a corrupt record in etcd: {}", uuid,
                                                      record ? "its host is not a uuid" : record.error().message()));
  co_return FoundInstance{std::move(*record), found->revision, found->kvs.front().mod_revision};
}

awaitable<result<FoundInstance>> find_instance(EtcdClient& etcd, const KeyLayout& keys, const std::string& uuid,
                                               std::chrono::seconds patience) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  Backoff backoff(std::chrono::milliseconds(50), std::chrono::seconds(1));
  for (;;) {
    auto found = co_await find_instance(etcd, keys, uuid);
    if (found || found.error() != errc::etcd_unavailable || std::chrono::steady_clock::now() >= deadline)
      co_return found;
    if (backoff.fresh()) spdlog::warn("instance {}: {}; asking again", uuid, found.error().message());
    co_await backoff.wait(deadline);
  }
}

namespace {

// One try at the desired power on the work key, written only over the version read. false: the
// work is not where the record says, or changed between the read and the write.
awaitable<result<bool>> try_request_power(EtcdClient& etcd, const KeyLayout& keys, const InstanceRecord& record,
                                          PowerState power) {
  const std::string work_key = keys.work(record.host, record.uuid);
  auto work = co_await etcd.range(work_key);
  if (!work) co_return etcd_error(etcd, work.error());
  if (work->kvs.empty()) co_return false;
  auto spec = decode_work(work->kvs.front().value);
  if (!spec)
    co_return Error(errc::corrupt_record, fmt::format("instance {} has a corrupt work record in etcd", record.uuid));
  if (spec->power == power) co_return true;
  if (spec->power == PowerState::deleted)
    co_return Error(errc::changed, fmt::format("instance {} is being destroyed", record.uuid));
  spec->power = power;
  std::vector<EtcdCompare> unchanged{EtcdCompare::mod_revision_is(work_key, work->kvs.front().mod_revision)};
  std::vector<EtcdOp> mark{EtcdOp::put(work_key, encode(*spec))};
  auto txn = co_await etcd.txn(std::move(unchanged), std::move(mark));
  if (!txn) co_return etcd_error(etcd, txn.error());
  co_return txn->succeeded;
}

}  // namespace

// An instance between hosts (a move, a build tried again elsewhere) has its work where its
// record does not say for a moment: the record is read again and the request follows it. An
// etcd that does not answer in time (away, or far behind under a burst of writes) is asked
// again: each try writes only over what it read, so a try that landed unseen is read back.
awaitable<result<void>> request_power(EtcdClient& etcd, const KeyLayout& keys, InstanceRecord record,
                                      PowerState power) {
  const auto deadline = std::chrono::steady_clock::now() + power_patience;
  Backoff backoff(std::chrono::milliseconds(50), std::chrono::seconds(1));
  for (;;) {
    auto asked = co_await try_request_power(etcd, keys, record, power);
    if (asked && *asked) co_return result<void>{};
    const bool unanswered = !asked && asked.error() == errc::etcd_unavailable;
    if (!asked && !unanswered) co_return asked.error();
    if (unanswered && backoff.fresh())
      spdlog::warn("instance {}: {}; asking again", record.uuid, asked.error().message());
    if (std::chrono::steady_clock::now() >= deadline) {
      if (unanswered) co_return asked.error();
      co_return Error(errc::changed, fmt::format("instance {} kept changing (its work is not on host {}); try again",
                                                 record.uuid, record.host));
    }
    co_await backoff.wait(deadline);
    auto found = co_await find_instance(etcd, keys, record.uuid);
    if (!found && found.error() == errc::not_found && power == PowerState::deleted) co_return result<void>{};
    if (found)
      record = std::move(found->record);
    else if (found.error() != errc::etcd_unavailable)
      co_return found.error();
  }
}

}  // namespace toyvm
