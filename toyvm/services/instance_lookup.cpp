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

}  // namespace toyvm
