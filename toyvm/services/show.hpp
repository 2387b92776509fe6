#pragma once
// What the parts of `toyvm show` share: an instance as JSON, and the modes that follow etcd
// until interrupted (services/show_follow.cpp).

#include "clients/etcd.hpp"
#include "core/async.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"
#include "services/services.hpp"

#include <boost/json/object.hpp>

namespace toyvm {

boost::json::object instance_json(const InstanceRecord& r);

// The tail of the serial console: a request under a short lease of our own asks the
// instance's agent to publish it (under the same lease, so both go when we do).
// `member_project`: the caller is a member of that project (empty: the cloud's admin).
awaitable<Outcome> show_console(EtcdClient& etcd, const KeyLayout& keys, std::string member_project,
                                const ShowOptions& options, Say& say);

// Where `show` reads instance records: every record (the cloud's admin), or a project's views
// of its own (its members and readers, as etcd's roles let them).
struct RecordsShown {
  std::string prefix;   // the records, each under it by its uuid
  bool member = false;  // a project's views: no usage, move, host or console of the cloud's
};

// Follows instance records in etcd and says each change as it happens, until interrupted
// (or, for one instance, until it is deleted). After a lost watch the listing is compared
// with what was last said, so a change made meanwhile is still told, once.
awaitable<Outcome> show_watch(EtcdClient& etcd, const RecordsShown& shown, const ShowOptions& options, Say& say);

}  // namespace toyvm
