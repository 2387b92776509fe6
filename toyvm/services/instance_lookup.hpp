#pragma once
// An instance's record as every command about one instance reads it (show, its console,
// destroy, start, stop), so an unknown or a corrupt one is told the same way everywhere.

#include "clients/etcd.hpp"
#include "core/async.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"

#include <chrono>
#include <string>

namespace toyvm {

struct FoundInstance {
  InstanceRecord record;
  int64_t revision = 0;      // of the read: a watch from here misses nothing
  int64_t mod_revision = 0;  // of the record
};

// The record of `uuid`, or why not: unknown instance, a record that cannot be read (or names
// no host), etcd out of reach.
awaitable<result<FoundInstance>> find_instance(EtcdClient& etcd, const KeyLayout& keys, const std::string& uuid);
// The same, asking again for `patience` while etcd does not answer in time (away, or far
// behind under a burst of writes), as a command that is about to change the instance does.
awaitable<result<FoundInstance>> find_instance(EtcdClient& etcd, const KeyLayout& keys, const std::string& uuid,
                                               std::chrono::seconds patience);

// How long a stop, start or destroy follows an instance moving between hosts, and asks etcd
// again while it does not answer in time: each of its reads and its request.
inline constexpr std::chrono::seconds power_patience{10};

// The instance's desired power on its work key, written only over the version read (stop,
// start, destroy; the scheduler service for a project's member). An instance moving between
// hosts is followed, and etcd not answering in time asked again, for power_patience; one
// destroyed meanwhile is, for a destroy, done.
awaitable<result<void>> request_power(EtcdClient& etcd, const KeyLayout& keys, InstanceRecord record,
                                      PowerState power);

}  // namespace toyvm
