#include "services/instance_lookup.hpp"

#include "model/uuid.hpp"
#include "services/common.hpp"

#include <fmt/format.h>

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

// Desired power on the work key, written only over the version read.
awaitable<result<void>> request_power(EtcdClient& etcd, const KeyLayout& keys, const InstanceRecord& record,
                                      PowerState power) {
  const std::string work_key = keys.work(record.host, record.uuid);
  auto work = co_await etcd.range(work_key);
  if (!work) co_return etcd_error(etcd, work.error());
  if (work->kvs.empty())
    co_return Error(errc::not_found, fmt::format("instance {} has no work on host {}", record.uuid, record.host));
  auto spec = decode_work(work->kvs.front().value);
  if (!spec)
    co_return Error(errc::corrupt_record, fmt::format("instance {} has a corrupt work record in etcd", record.uuid));
  if (spec->power == power) co_return result<void>{};
  if (spec->power == PowerState::deleted)
    co_return Error(errc::changed, fmt::format("instance {} is being destroyed", record.uuid));
  spec->power = power;
  std::vector<EtcdCompare> unchanged{EtcdCompare::mod_revision_is(work_key, work->kvs.front().mod_revision)};
  std::vector<EtcdOp> mark{EtcdOp::put(work_key, encode(*spec))};
  auto txn = co_await etcd.txn(std::move(unchanged), std::move(mark));
  if (!txn) co_return etcd_error(etcd, txn.error());
  if (!txn->succeeded) co_return Error(errc::changed, fmt::format("instance {} changed meanwhile; try again", record.uuid));
  co_return result<void>{};
}

}  // namespace toyvm
