#pragma once
// The JSON values toyvm keeps in etcd, and their codecs. Decoding never trusts its input:
// anything malformed comes back as errc::corrupt_record with a detail.

#include "core/error.hpp"
#include "model/groups.hpp"
#include "model/projects.hpp"
#include "model/query.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toyvm {

struct HostRecord {
  std::string name;
  std::string provider;          // resource provider uuid
  std::string status = "READY";  // READY, FULL, DISABLED
  ResourceAmounts capacity;      // (total - reserved) * allocation_ratio per class
  std::string agent_version;
  int64_t started_at = 0;        // unix seconds

  bool operator==(const HostRecord&) const = default;
};

// What the host's agent measures every stats_interval (CIAO's STATS), under its lease.
struct HostStats {
  int64_t mem_total_mb = 0;
  int64_t mem_available_mb = 0;   // MemFree + Active(file) + Inactive(file)
  int64_t disk_total_mb = 0;      // the filesystem of the instance dir
  int64_t disk_available_mb = 0;
  double load = 0;                // the one-minute load average
  int64_t cpus_online = 0;
  int64_t at = 0;                 // unix seconds

  bool operator==(const HostStats&) const = default;
};

// What an instance uses, measured by its agent when asked (`toyvm show <uuid>`).
struct InstanceUsage {
  bool running = false;
  int64_t vcpus = 0;
  double cpu_time_s = 0;         // all its vCPUs together, since its guest started
  double cpu_share = 0;          // busy share of its vCPUs over `window_s` (1 = all of them)
  double window_s = 0;
  int64_t memory_mb = 0;         // what the guest has
  int64_t rss_mb = -1;           // what its process holds in host RAM; -1 (null in JSON): unknown
  int64_t disk_capacity = -1;    // the overlay's virtual size in bytes; -1 (null): no disk
  int64_t disk_allocation = -1;  // what of it is allocated on the host, in bytes
  bool simulated = false;        // libvirt's test driver made the figures up: nothing measured
  int64_t at = 0;                // unix milliseconds

  bool operator==(const InstanceUsage&) const = default;
};

// An operator took the host out of service (`toyvm host disable`); kept until enabled.
// A project (`projects/<name>`); its limits are apart (`quotas/<name>`, model/projects.hpp), so
// that changing them leaves the record, which hand-overs into the project require, as it is.
struct ProjectRecord {
  int64_t created_at = 0;  // unix seconds
  bool deleting = false;   // `project delete` is looking for its instances: it takes nothing new

  bool operator==(const ProjectRecord&) const = default;
};

struct HostMaintenance {
  std::string reason;
  int64_t at = 0;  // unix seconds

  bool operator==(const HostMaintenance&) const = default;
};

enum class PowerState { running, stopped, deleted };

struct WorkSpec {
  std::string uuid;
  std::string name;
  std::string project{default_project};  // whose it is (written before projects: the default)
  std::string user;                       // who made it; empty: not known
  std::string image;          // image reference: a name in the image dir or a URL
  std::string image_sha256;   // expected digest of a fetched image, lowercase hex; empty: unchecked
  std::string image_format;   // raw or qcow2; empty: as the image's name says
  std::string query;          // the placement query it was scheduled with
  std::string availability_zone;  // the zone it was scheduled into (schedule --az): it moves within it
  ResourceAmounts resources;  // what it consumes on its host
  std::string user_data;      // raw bytes for cloud-init (base64 in JSON)
  std::vector<std::pair<std::string, std::string>> keys;  // ssh key name, public key
  bool config_drive = false;  // the guest gets its metadata on a config drive too
  std::string group;          // server group name, empty: none
  std::optional<GroupPolicy> group_policy;  // with a group: its policy
  PowerState power = PowerState::running;
  int attempt = 1;
  int64_t created_at = 0;     // unix seconds

  bool operator==(const WorkSpec&) const = default;
};

enum class InstanceState { scheduled, building, active, stopped, error, deleting };

struct InstanceRecord {
  std::string uuid;
  std::string name;
  std::string project{default_project};
  std::string host;
  InstanceState state = InstanceState::scheduled;
  std::string ip;
  std::string mac;
  bool no_address = false;    // ACTIVE, and the agent stopped looking for the guest's address
  bool releasing = false;     // ERROR, and its allocation is still being given back
  std::string error_code;     // CIAO's reason codes: image_failure, launch_failure, ...
  std::string error_message;
  int64_t updated_at = 0;     // unix milliseconds

  bool operator==(const InstanceRecord&) const = default;
};

std::string_view to_string(PowerState power) noexcept;
std::string_view to_string(InstanceState state) noexcept;

std::string encode(const HostRecord& record);
std::string encode(const HostStats& stats);
std::string encode(const HostMaintenance& maintenance);
std::string encode(const InstanceUsage& usage);
std::string encode(const WorkSpec& spec);
std::string encode(const InstanceRecord& record);
std::string encode(const ProjectRecord& project);
std::string encode_limits(const Limits& limits);

result<HostRecord> decode_host(std::string_view json);
result<HostStats> decode_host_stats(std::string_view json);
result<HostMaintenance> decode_maintenance(std::string_view json);
result<InstanceUsage> decode_usage(std::string_view json);
result<WorkSpec> decode_work(std::string_view json);
result<InstanceRecord> decode_instance(std::string_view json);
result<ProjectRecord> decode_project(std::string_view json);
result<Limits> decode_limits(std::string_view json);

// Placement's owner of an instance's consumers (and of its migration's): its project's id and
// the user who made it (`consumer_user` when not known).
ConsumerOwner owner_of(const WorkSpec& work, std::string_view consumer_project, std::string_view consumer_user);

int64_t unix_seconds();
int64_t unix_millis();

// A schedule's hold on its claims: the unix milliseconds until which it stands, renewed while
// the schedule runs, so that `audit --fix` leaves its claims alone. A schedule keeps it in one
// key (`holds/<its first instance>`), which each of its claims (`claims/<instance>`) names, so
// a renewal is one write however many it claims for. A claim's value may also be the deadline
// itself (an older schedule's), or empty: a hold under a lease (the scheduler service's),
// which ends with it.
std::string encode_hold(int64_t until_ms);
// A claim's value naming its schedule's hold, and the hold it names (none: it names none).
std::string encode_hold_name(std::string_view first_instance);
std::optional<std::string_view> named_hold(std::string_view claim_value);
// How far apart two hosts' clocks may be: a hold lapses only this long after its deadline.
constexpr int64_t hold_clock_margin_ms = 5000;
// Whether the hold has lapsed at `now_ms`: its schedule is gone (killed, or cut off from etcd
// for longer than it holds). Never one under a lease, nor one that cannot be read (unknown
// is not absent).
bool hold_lapsed(std::string_view value, int64_t now_ms);

}  // namespace toyvm
