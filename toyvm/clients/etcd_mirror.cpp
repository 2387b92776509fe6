#include "clients/etcd_mirror.hpp"

#include <algorithm>

namespace toyvm {

void EtcdMirror::take(const RangeResult& listed) {
  // Events come in order: a listing newer than the last one taken holds every event taken and
  // none still to come.
  if (listed.revision <= revision_) return;
  kvs_.clear();
  for (const KeyValue& kv : listed.kvs) kvs_[kv.key] = kv;
  revision_ = listed_revision_ = listed.revision;
}

void EtcdMirror::take(const WatchEvent& event) {
  // A listing made while the watch ran holds what the watch says up to its revision.
  if (event.kv.mod_revision <= listed_revision_) return;
  if (event.type == WatchEvent::Type::erase) {
    kvs_.erase(event.kv.key);
  } else {
    kvs_[event.kv.key] = event.kv;
  }
  revision_ = std::max(revision_, event.kv.mod_revision);
}

RangeResult EtcdMirror::listing() const {
  RangeResult listed;
  listed.revision = revision_;
  listed.count = int64_t(kvs_.size());
  for (const auto& [key, kv] : kvs_) listed.kvs.push_back(kv);
  return listed;
}

}  // namespace toyvm
