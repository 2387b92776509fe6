#pragma once
// toyvm's configuration: defaults < TOML file < environment < command-line flags.
// Every key is documented in README.md ("Configuration").

#include "core/error.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace toyvm {

// Durations in the configuration and on the command line are written in seconds (decimals
// allowed) and held as milliseconds from the moment they are read.
using Duration = std::chrono::milliseconds;
inline Duration from_seconds(double seconds) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds));
}
// For messages: "2.5" for 2500 ms.
inline double in_seconds(Duration duration) { return std::chrono::duration<double>(duration).count(); }

struct EtcdConfig {
  std::vector<std::string> endpoints{"http://127.0.0.1:2379"};
  std::string prefix = "/toyvm/v1";
  Duration timeout{5000};  // per call
  // TLS when the endpoints are https://: the CA to trust (empty: the system's), a client
  // certificate and key for client-cert auth, and a name to check the server's certificate
  // against instead of the endpoint's host.
  std::string ca_file, cert_file, key_file, server_name;
  // etcd's own user/password auth (Authenticate): the token is renewed when it expires. A
  // user without a password names the client certificate's common name (no Authenticate).
  std::string user, password;
  // A long-lived service's client: HTTP/2 keepalive pings, so that it notices a dead etcd,
  // and its leases renewed through etcd's leader; set by the services, not in the file. Short
  // commands go without (gRPC 1.51 can abort when a channel goes away with a ping in flight;
  // finding the leader would cost them two requests more).
  bool keepalive = false;
};

struct PlacementConfig {
  std::string endpoint = "http://127.0.0.1:8080";
  std::string token = "admin";
  std::string token_header = "X-Auth-Token";
  Duration timeout{10000};  // per request
  int candidate_limit = 50;  // `limit` on GET /allocation_candidates unless the query has one
  // A large cloud's hosts in this many shards (Placement aggregates); a schedule asks about one
  // at random first, the whole cloud only when it has no room. 0: none. One per 100 hosts or so.
  int shards = 0;
  // A schedule of one instance (spread, no group, no place named in its query) asks about this
  // many hosts picked at random first, each alone, the shard and the cloud only when none has
  // room: Placement's search costs as much as the cloud is big, its search of one host does
  // not. 0: never.
  int sample_hosts = 0;
  std::string ca_file;       // https endpoint: the CA to trust; empty: the system's
  // Keystone v3 password authentication instead of the static token: a project-scoped token
  // is fetched from auth_url and fetched again when it expires or Placement answers 401.
  std::string auth_url;      // e.g. http://keystone:5000/v3
  std::string user, password, project;
  std::string user_domain = "Default", project_domain = "Default";
  // Who toyvm's claims belong to in Placement: audit judges only these consumers, so another
  // service (or another toyvm with its own ids) sharing the Placement is left alone.
  std::string consumer_project = "toyvm";
  std::string consumer_user = "toyvm";
  // The trait every agent puts on its provider: schedules pick only such providers and audit
  // judges only them (CUSTOM_ and 1 to 248 of A-Z 0-9 _).
  std::string provider_trait = "CUSTOM_TOYVM_HOST";
};

// Reserved amounts and allocation ratios of a measured host's inventory (Nova's defaults).
struct InventoryPolicy {
  int64_t reserved_vcpu = 0;
  int64_t reserved_memory_mb = 512;
  int64_t reserved_disk_gb = 0;
  double cpu_allocation_ratio = 4.0;
  double ram_allocation_ratio = 1.0;
  double disk_allocation_ratio = 1.0;
};

struct ComputeConfig {
  std::string state_dir = "/var/lib/toyvm";
  std::string instance_dir;  // default: <state_dir>/instances
  std::string libvirt_uri = "qemu:///system";
  std::string domain_type;    // kvm or qemu (TCG); empty: "test" on test://, else qemu
  std::string name;           // provider name; default: the host name
  std::string inventory;      // "VCPU:4,DISK_GB:10,MEMORY_MB:512" overrides measuring the host
  std::vector<std::string> traits;  // traits to put on the provider besides the CPU's
  std::string availability_zone;    // empty: none
  InventoryPolicy policy;
  std::string metadata_interface;  // e.g. virbr0: the agent serves its guests' metadata there
  bool config_drive = false;       // every guest gets a config drive, asked for or not
  std::chrono::seconds lease_ttl{10};
  int workers = 4;            // threads for blocking libvirt and disk work
  int max_instances = 0;      // the host reports FULL at this many; 0: no limit
  Duration resync_interval{60000};  // full re-list of this host's work
  Duration stats_interval{30000};   // the host's figures (memory, disk, load) to etcd
  int max_build_attempts = 3;     // hosts an instance may try before no_valid_host
  // Guests: images, network, power.
  std::string image_dir;          // names and file:// images; default: <state_dir>/images
  std::string image_cache_dir;    // fetched images; default: <state_dir>/image-cache
  double image_cache_max_gb = 20; // unused images are dropped past this
  double image_max_gb = 20;       // largest image a download may bring
  std::vector<std::string> image_schemes{"http", "https", "file"};
  std::string image_ca_file;      // CAs for https images; empty: the system's
  std::string network = "default";  // libvirt network for guest NICs; empty: no NIC
  std::string bridge;             // a host bridge instead of a libvirt network
  std::string nic_model = "virtio";
  std::string guest_filter = "clean-traffic";  // nwfilter on each guest NIC; empty: none
  Duration address_timeout{300000}; // how long to look for a new guest's IP
  Duration stop_timeout{30000};     // a guest asked to power off is forced off after this
  std::string metrics_listen;     // ADDRESS:PORT for Prometheus' /metrics; empty: off
  std::string on_guest_crash = "restart";  // or "error": ERROR launch_failure, resources given back
  Duration console_interval{2000};  // how often a grown console log is published to etcd
  // Guests moving here: this host's libvirt as the other hosts' libvirt daemons reach it, and
  // the address their QEMU sends a guest's memory and disk to. Empty: qemu+tcp://<name>/system
  // and the host's name.
  std::string move_libvirt_uri;
  std::string move_address;
  Duration move_prepare_timeout{120000};  // a destination that has not prepared by then: the move reverts
  // A live move that has not completed after this many seconds per GiB of the guest's memory
  // and disk is aborted (virDomainAbortJob) and undone: Nova's live_migration_completion_timeout.
  double live_migration_completion_timeout = 800;
  // Guests this host sends at once (live, or a cold move's disk), on threads of their own so that
  // its other guests never wait behind them: Nova's max_concurrent_live_migrations.
  int max_concurrent_moves = 1;
};

struct ScheduleConfig {
  std::string image;  // empty: a domain with no image (boots nothing)
  std::string policy = "spread";  // spread or pack
  double ram_weight_multiplier = 1.0;
  double cpu_weight_multiplier = 1.0;
  double disk_weight_multiplier = 1.0;
  int host_subset_size = 1;
  int max_claim_attempts = 8;  // PUT /allocations retries on concurrent_update per candidate
  std::string project = "default";  // the project of instances scheduled without --project
};

struct MdserverConfig {
  std::vector<std::string> listen{"169.254.169.254:80"};
  std::string metrics_listen;  // ADDRESS:PORT for Prometheus' /metrics; empty: off
  int max_connections = 4096;
  Duration idle_timeout{10000};  // a connection that sends nothing for this long is closed
  std::string availability_zone = "nova";
  std::vector<std::string> guest_networks;  // CIDRs allowed to ask; empty: any address
  double rate_limit = 50;     // requests per second per source address; 0: off
  double rate_burst = 100;    // requests a source may make at once
};

struct SecurityConfig {
  // A config file holding a secret (a Placement token other than noauth's "admin") must not
  // be readable by other users unless this says so.
  bool allow_readable_secrets = false;
};

struct Config {
  EtcdConfig etcd;
  PlacementConfig placement;
  ComputeConfig compute;
  ScheduleConfig schedule;
  MdserverConfig mdserver;
  SecurityConfig security;
  std::string source_file;  // the TOML file read, if any
};

// What the flags common to every subcommand can set; empty means "not given".
struct CommonOverrides {
  std::string config_file;
  std::string etcd;       // URL[,URL...]
  std::string placement;  // URL
  // etcd TLS and auth; the password only from the environment (TOYVM_ETCD_PASSWORD), never
  // from a flag, which any user could read in the process list.
  std::string etcd_ca, etcd_cert, etcd_key, etcd_server_name, etcd_user;
};

// Reads the TOML file (if any) and applies environment and flags on top.
result<Config> load_config(const CommonOverrides& flags);

// Parses TOML text; unknown keys are errors so that typos do not pass silently.
result<Config> parse_config(std::string_view toml_text);

std::vector<std::string> split_endpoints(std::string_view list);

}  // namespace toyvm
