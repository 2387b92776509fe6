#include "services/compute/recorder.hpp"

#include <fmt/format.h>

namespace toyvm::compute {

InstanceRecord InstanceRecorder::make(const WorkSpec& spec, InstanceState state, std::string ip,
                                      bool no_address) const {
  InstanceRecord record;
  record.uuid = spec.uuid;
  record.name = spec.name;
  record.project = spec.project;
  record.host = ctx_.host.provider;
  record.state = state;
  if (state == InstanceState::active) {
    record.ip = std::move(ip);
    record.no_address = no_address;
  }
  if (ctx_.has_nic() && (state == InstanceState::active || state == InstanceState::stopped))
    record.mac = instance_mac(spec.uuid);
  record.updated_at = unix_millis();
  return record;
}

awaitable<result<void>> InstanceRecorder::write(InstanceRecord record, std::vector<EtcdOp> also) {
  // (Vectors built outside co_await: GCC 12 miscompiles initializer lists inside it.)
  std::vector<EtcdCompare> compare{EtcdCompare::present(ctx_.keys.work(ctx_.host.provider, record.uuid))};
  std::vector<EtcdOp> ops;
  const std::string value = encode(record);
  for (std::string& key : ctx_.keys.record_keys(record.project, record.uuid)) ops.push_back(EtcdOp::put(std::move(key), value));
  ops.insert(ops.end(), std::make_move_iterator(also.begin()), std::make_move_iterator(also.end()));
  auto txn = co_await ctx_.etcd->txn(std::move(compare), std::move(ops));
  if (!txn) co_return txn.error().doing(fmt::format("recording {}", to_string(record.state)));
  // The work left this host (moved, or deleted) before the feed said so: whatever was under
  // way for it stops, and the next round follows what the feed says by then.
  if (!txn->succeeded)
    co_return Error(errc::changed,
                    fmt::format("its work is no longer on this host; {} not recorded", to_string(record.state)));
  co_return result<void>{};
}

awaitable<result<std::optional<InstanceRecord>>> InstanceRecorder::read(std::string uuid) {
  auto found = co_await ctx_.etcd->range(ctx_.keys.instance(uuid));
  if (!found) co_return found.error();
  std::optional<InstanceRecord> mine;
  if (!found->kvs.empty()) {
    auto record = decode_instance(found->kvs.front().value);
    if (record && record->host == ctx_.host.provider) mine = std::move(*record);
  }
  co_return mine;
}

}  // namespace toyvm::compute
