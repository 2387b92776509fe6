#include "services/compute/recorder.hpp"

#include <spdlog/spdlog.h>

namespace toyvm::compute {

InstanceRecord InstanceRecorder::make(const WorkSpec& spec, InstanceState state) {
  InstanceRecord record;
  record.uuid = spec.uuid;
  record.name = spec.name;
  record.host = ctx_.host.provider;
  record.state = state;
  if (state == InstanceState::active) {
    const InstanceSlot& slot = slots_[spec.uuid];
    record.ip = slot.ip;
    record.no_address = slot.address_given_up;
  }
  if (ctx_.has_nic() && (state == InstanceState::active || state == InstanceState::stopped))
    record.mac = instance_mac(spec.uuid);
  record.updated_at = unix_millis();
  return record;
}

awaitable<bool> InstanceRecorder::write(InstanceRecord record) {
  co_return co_await write_checked(std::move(record)) == Written::made;
}

awaitable<InstanceRecorder::Written> InstanceRecorder::write_checked(InstanceRecord record,
                                                                   std::vector<EtcdOp> also) {
  // (Vectors built outside co_await: GCC 12 miscompiles initializer lists inside it.)
  std::vector<EtcdCompare> compare{EtcdCompare::present(ctx_.keys.work(ctx_.host.provider, record.uuid))};
  std::vector<EtcdOp> ops{EtcdOp::put(ctx_.keys.instance(record.uuid), encode(record))};
  ops.insert(ops.end(), std::make_move_iterator(also.begin()), std::make_move_iterator(also.end()));
  auto txn = co_await ctx_.etcd->txn(std::move(compare), std::move(ops));
  if (!txn) {
    spdlog::warn("instance {}: recording {}: {}", record.uuid, to_string(record.state), txn.error().message());
    co_return Written::unanswered;
  }
  if (!txn->succeeded) {
    // The work left this host (moved, or deleted) before the feed said so: whatever was
    // under way for it stops, and the next round follows what the feed says by then.
    spdlog::info("instance {}: its work is no longer on this host; {} not recorded", record.uuid,
                 to_string(record.state));
    co_return Written::work_gone;
  }
  InstanceSlot& slot = slots_[record.uuid];
  slot.recorded = record.state;
  if (record.state == InstanceState::error) {
    slot.failure = std::move(record);
  } else {
    slot.failure.reset();
  }
  co_return Written::made;
}

awaitable<bool> InstanceRecorder::record(WorkSpec spec, InstanceState state) {
  InstanceSlot& slot = slots_[spec.uuid];
  if (state == InstanceState::active && slot.recorded != InstanceState::active) {
    // A guest that just started gets an address from DHCP: look for it until the deadline.
    slot.address_deadline = std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(int64_t(ctx_.config.compute.address_timeout_s * 1000));
    slot.address_given_up = false;
  }
  if (state != InstanceState::active) slot.ip.clear();
  co_return co_await write(make(spec, state));
}

awaitable<InstanceRecorder::Written> InstanceRecorder::record_made(WorkSpec spec, InstanceState state,
                                                                  std::vector<EtcdOp> also) {
  InstanceSlot& slot = slots_[spec.uuid];
  slot.ip.clear();
  slot.address_given_up = false;
  if (state == InstanceState::active)
    slot.address_deadline = std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(int64_t(ctx_.config.compute.address_timeout_s * 1000));
  co_return co_await write_checked(make(spec, state), std::move(also));
}

awaitable<bool> InstanceRecorder::load(std::string uuid) {
  if (slots_[uuid].recorded_loaded) co_return true;
  auto found = co_await ctx_.etcd->range(ctx_.keys.instance(uuid));
  if (!found) co_return false;
  InstanceSlot& slot = slots_[uuid];
  slot.recorded_loaded = true;
  if (found->kvs.empty() || slot.recorded) co_return true;
  auto record = decode_instance(found->kvs.front().value);
  if (!record || record->host != ctx_.host.provider) co_return true;
  slot.recorded = record->state;
  if (record->state == InstanceState::error) slot.failure = *record;
  if (record->state == InstanceState::active) {
    slot.ip = record->ip;
    slot.address_given_up = record->no_address;
    // Still looking when the last agent stopped: look for a full address_timeout again.
    slot.address_deadline = std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(int64_t(ctx_.config.compute.address_timeout_s * 1000));
  }
  co_return true;
}

}  // namespace toyvm::compute
