#pragma once
// What is under one prefix of etcd as a follower knows it: a listing, then the watch's events
// since. etcd delivers a watch's events in revision order, so this is what a listing would say
// at the last event's revision, without asking etcd again.

#include "clients/etcd.hpp"

#include <map>
#include <string>

namespace toyvm {

class EtcdMirror {
 public:
  // A listing newer than every event taken replaces what is known; an older one adds nothing.
  void take(const RangeResult& listed);
  // One event from a watch that began at or before the last listing's revision.
  void take(const WatchEvent& event);
  // As a listing: its revision is the newest taken (0 before any).
  RangeResult listing() const;
  int64_t revision() const { return revision_; }

 private:
  std::map<std::string, KeyValue> kvs_;
  int64_t revision_ = 0;
  int64_t listed_revision_ = 0;  // events up to it are in the last listing taken
};

}  // namespace toyvm
