// Moving a running guest between two libvirt daemons: the destination prepares its files, the
// source's libvirt drives the migration to the destination's itself (peer to peer), copying
// the disk's contents into the prepared overlay over NBD while the guest runs.

#include "virt/libvirt_backend.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>

namespace toyvm::libvirt_impl {
namespace {

virTypedParameter string_parameter(const char* field, const std::string& value) {
  virTypedParameter parameter{};
  std::strncpy(parameter.field, field, VIR_TYPED_PARAM_FIELD_LENGTH - 1);
  parameter.type = VIR_TYPED_PARAM_STRING;
  parameter.value.s = const_cast<char*>(value.c_str());  // libvirt only reads it
  return parameter;
}

}  // namespace

result<std::string> LibvirtBackend::prepare_incoming(const DomainSpec& spec) {
  if (!revive()) return unavailable();
  if (auto network = ensure_network(); !network) return network.error();
  return make_files(spec);
}

// The finished move as the destination's libvirt has it (the source sends its figures along).
MigrationStats LibvirtBackend::completed_migration(const std::string& uuid, const MigrationTarget& to) {
  MigrationStats stats;
  virConnectPtr there = api->virConnectOpen(to.libvirt_uri.c_str());
  if (!there) return stats;
  if (virDomainPtr dom = api->virDomainLookupByUUIDString(there, uuid.c_str())) {
    int type = 0, count = 0;
    virTypedParameterPtr params = nullptr;
    if (api->virDomainGetJobStats(dom, &type, &params, &count, VIR_DOMAIN_JOB_STATS_COMPLETED) == 0) {
      unsigned long long value = 0;
      if (api->virTypedParamsGetULLong(params, count, VIR_DOMAIN_JOB_DOWNTIME, &value) == 1)
        stats.downtime_ms = int64_t(value);
      if (api->virTypedParamsGetULLong(params, count, VIR_DOMAIN_JOB_DATA_PROCESSED, &value) == 1) stats.bytes = value;
      api->virTypedParamsFree(params, count);
    }
    api->virDomainFree(dom);
  }
  api->virConnectClose(there);
  return stats;
}

result<MigrationStats> LibvirtBackend::migrate(const std::string& uuid, const MigrationTarget& to) {
  if (!revive()) return unavailable();
  DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
  if (!dom) return fail(errc::not_found, "no domain to migrate");
  virTypedParameter parameters[] = {string_parameter(VIR_MIGRATE_PARAM_URI, to.migration_uri),
                                    string_parameter(VIR_MIGRATE_PARAM_DEST_XML, to.domain_xml),
                                    string_parameter(VIR_MIGRATE_PARAM_PERSIST_XML, to.domain_xml)};
  // Live, the disk copied (local overlays), defined there and undefined here once it runs there.
  const unsigned flags = VIR_MIGRATE_LIVE | VIR_MIGRATE_PEER2PEER | VIR_MIGRATE_PERSIST_DEST |
                         VIR_MIGRATE_UNDEFINE_SOURCE | VIR_MIGRATE_NON_SHARED_DISK;
  const auto started = std::chrono::steady_clock::now();
  if (api->virDomainMigrateToURI3(dom.ptr, to.libvirt_uri.c_str(), parameters, 3, flags) < 0)
    return fail(errc::launch_failure, "migrating to " + to.libvirt_uri);
  const auto took = std::chrono::steady_clock::now() - started;
  forget_owned(uuid);
  if (auto removed = remove_files(uuid); !removed)
    spdlog::warn("instance {}: moved, but its files here remain: {}", uuid, removed.error().message());
  MigrationStats stats = completed_migration(uuid, to);
  stats.total_ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  return stats;
}

result<bool> LibvirtBackend::migrating(const std::string& uuid) {
  if (!revive()) return unavailable();
  DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
  if (!dom) {
    if (last_error_is(VIR_ERR_NO_DOMAIN)) return false;
    return fail(errc::launch_failure);
  }
  virDomainJobInfo job{};
  if (api->virDomainGetJobInfo(dom.ptr, &job) == 0 && job.type != VIR_DOMAIN_JOB_NONE) return true;
  int state = 0, reason = 0;
  if (api->virDomainGetState(dom.ptr, &state, &reason, 0) < 0) return fail(errc::launch_failure);
  return state == VIR_DOMAIN_PAUSED && (reason == VIR_DOMAIN_PAUSED_MIGRATION || reason == VIR_DOMAIN_PAUSED_STARTING_UP ||
                                        reason == VIR_DOMAIN_PAUSED_POSTCOPY);
}

}  // namespace toyvm::libvirt_impl
