#pragma once
// Test harness: private etcd and Placement servers on free loopback ports in temporary
// directories, toyvm processes, and synchronous helpers to inspect the servers' state.

#include "clients/etcd.hpp"
#include "clients/http.hpp"
#include "clients/placement.hpp"
#include "core/config.hpp"
#include "model/records.hpp"

#include <sys/types.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace toyvm::test {

class TempDir {
 public:
  TempDir();
  // `path`, made if need be and kept: the caller's.
  explicit TempDir(std::string path);
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool kept_ = false;
};

uint16_t free_port();
// Whether a server could listen on `port` now: nothing, not even a killed process that has not
// yet let go of its socket, listens there.
bool port_bindable(uint16_t port);
std::string read_file(const std::string& path);

// A child process in a process group of its own; signals go to the whole group (uWSGI's
// workers, the server under runuser). Killed when this object goes and when the test dies.
class Process {
 public:
  Process(std::vector<std::string> argv, std::string log_file);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  void signal(int sig);
  // The exit code (128 + signal when killed); -1 if it did not end within the timeout.
  int wait(double timeout_s = 60);
  const std::string& log_file() const { return log_file_; }
  std::string output() const { return read_file(log_file_); }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  std::string log_file_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Polls `condition` until it holds or the deadline passes.
bool wait_for(const std::function<bool()>& condition, double timeout_s);

// Runs a coroutine to completion on a private event loop.
template <class T>
T run_sync(std::function<awaitable<T>(asio::io_context&)> make);

struct ServersOptions {
  int etcd_members = 1;        // > 1: etcd as a cluster on loopback, as real deployments run it
  bool postgresql = false;     // Placement on a private PostgreSQL instead of sqlite
  int placement_workers = 2;
  bool etcd_tls = false;       // https with client-certificate auth, certificates made by openssl
  bool etcd_crl = false;       // with etcd_tls: etcd checks client certificates against pki/crl.pem
  bool etcd_auth = false;      // etcd's user/password auth on, user "root"
  bool placement_https = false;  // Placement behind a TLS-terminating uWSGI router
  int keystone_token_s = 0;      // > 0: Placement checks tokens with a private Keystone
                                 // whose tokens live this many seconds
  std::string dir{};             // where they keep their data and logs; empty: a temporary dir
  std::vector<std::string> etcd_args{};  // more flags for every etcd member (compaction, backend)
};

class Servers {
 public:
  explicit Servers(ServersOptions options = {});
  ~Servers();

  Config config;  // endpoints of these servers
  const std::string& dir() const { return dir_.path(); }
  // With etcd_tls or etcd_auth: a config file (mode 600) holding the [etcd] settings that
  // toyvm needs besides the endpoints; toyvm processes get it through TOYVM_CONFIG.
  std::string secure_config;
  std::string pki() const { return dir() + "/pki"; }

  std::vector<std::string> toyvm_argv(std::vector<std::string> args) const;
  CommandResult toyvm(std::vector<std::string> args, double timeout_s = 60) const;
  // Runs toyvm in the background; its output goes to a log file in the temp dir.
  std::unique_ptr<Process> spawn_toyvm(std::vector<std::string> args, const std::string& log_name) const;
  // The same, paused at failpoint `point` while the file `paused` (made here) exists; returns
  // once it waits there (throws if it does not within 20 s).
  std::unique_ptr<Process> spawn_toyvm_paused(const std::string& point, const std::string& paused,
                                              std::vector<std::string> args, const std::string& log_name) const;

  // Starts `toyvm compute` on libvirt's test driver and waits until its host record is in
  // etcd; returns its provider uuid through `provider`.
  // `compute_toml` (the body of a [compute] table) goes into a config file when not empty.
  std::unique_ptr<Process> start_compute(const std::string& name, const std::string& inventory,
                                         std::string* provider, std::vector<std::string> extra = {},
                                         const std::string& compute_toml = "");

  HttpClientOptions placement_http_options() const {
    return HttpClientOptions{config.placement.endpoint, std::chrono::milliseconds(10'000),
                             std::chrono::milliseconds(20'000), config.placement.ca_file};
  }

  void stop_etcd(int signal = SIGKILL);
  void stop_etcd_member(size_t index);  // the one behind config.etcd.endpoints[index]
  // The index (in config.etcd.endpoints) of the member that is the cluster's leader now.
  int etcd_leader() const;
  // Kills the member that is the cluster's leader now; returns its index.
  int kill_etcd_leader();
  void stop_placement();
  // On the same port, with the same data.
  void start_etcd_again();
  void start_placement_again();

  // Synchronous views of the servers.
  std::vector<KeyValue> etcd_prefix(const std::string& prefix) const;
  void etcd_put(const std::string& key, const std::string& value) const;
  void etcd_erase(const std::string& key) const;
  // Compacts etcd's history up to its current revision (etcdctl compact), as etcd's
  // --auto-compaction-retention does over time; returns that revision.
  int64_t etcd_compact() const;
  ResourceAmounts usages(const std::string& provider) const;
  Allocations allocations(const std::string& consumer) const;
  // A claim made behind toyvm's back, as a leak or a crashed scheduler would leave it.
  void claim(const std::string& consumer, const Allocations& allocations) const;
  // Nova's first step of a move, as a command that died right after it leaves it: the
  // migration consumer takes what the instance holds, and the instance the same on `to`.
  void move_books(const std::string& instance, const std::string& migration, const std::string& to) const;
  void set_traits(const std::string& provider, std::vector<std::string> traits) const;
  std::string provider_uuid_of(const std::string& compute_name) const;
  int provider_count() const;

 private:
  void start_etcd();
  void start_placement();
  void start_postgresql();
  bool etcd_answers(double timeout_s) const;
  bool placement_answers(double timeout_s) const;

  TempDir dir_;
  std::shared_ptr<EtcdClient> etcd_client_;  // one channel for the whole test
  struct EtcdMember {
    uint16_t client_port = 0;
    uint16_t peer_port = 0;
    std::unique_ptr<Process> process;
  };
  std::vector<EtcdMember> etcd_;
  uint16_t placement_port_ = 0;
  std::unique_ptr<Process> placement_;
  std::unique_ptr<Process> placement_tls_;
  std::unique_ptr<Process> keystone_;
  void start_keystone();
  std::unique_ptr<Process> postgres_;
  ServersOptions options_;
  std::string database_url_;  // empty: sqlite
};

// Waits until the instance record says `state` (e.g. "ACTIVE"); returns the last `show --json`.
std::string wait_for_state(const Servers& servers, const std::string& uuid, const std::string& state,
                           double timeout_s = 30);

// The instance record once `condition` holds for it (nullopt after the timeout).
std::optional<InstanceRecord> wait_for_record(const Servers& servers, const std::string& uuid,
                                              const std::function<bool(const InstanceRecord&)>& condition,
                                              double timeout_s = 30);

// A CA, a server certificate for 127.0.0.1 and a client certificate for user root (ca.crt,
// server.crt/key, client.crt/key), and other-ca.crt, which signed none of them.
void make_certificates(const std::string& pki);
// A client certificate <cn>.crt (and .key) signed by that CA: etcd's user <cn> with --client-cert-auth.
void make_client_certificate(const std::string& pki, const std::string& cn);
// One whose validity ended in 2020.
void make_expired_client_certificate(const std::string& pki, const std::string& cn);
// pki/crl.pem revoking these (made by make_client_certificate); empty: a list revoking nothing.
void write_revocation_list(const std::string& pki, const std::vector<std::string>& revoked);

// An HTTP server (Python's http.server) serving `dir`; its log lists every request. With
// `pki`, HTTPS with pki/server.crt.
struct FileServer {
  FileServer(const std::string& dir, const std::string& log_file, const std::string& pki = "");
  std::string url(const std::string& file) const;
  int requests_for(const std::string& file) const;  // GETs seen so far
  uint16_t port = 0;
  bool https = false;
  std::unique_ptr<Process> process;
};

// A server that accepts connections and never answers: downloads from it hang.
struct StallingServer {
  explicit StallingServer(const std::string& log_file);
  std::string url() const;
  uint16_t port = 0;
  std::unique_ptr<Process> process;
};

// libvirtd and virtlogd for qemu:///system, started if not running (first connection waits
// while libvirtd probes QEMU).
void ensure_libvirtd();
// Whether `ip` answers an ICMP echo within `timeout_s` (a raw socket: the tests run as root).
bool answers_ping(const std::string& ip, double timeout_s = 1);

// A second libvirtd on this machine (contrib/second-libvirtd.sh), as a second host; its URI.
std::string ensure_second_libvirtd();
// The first daemon's URI as the second one reaches it (a guest moving back goes there).
std::string first_libvirtd_from_second();
// The second libvirtd killed (-9), as a host's daemon dies, then started again by the script
// (its guests' QEMU processes live on and it finds them again).
void kill_and_restart_second_libvirtd();
// The tiny direct-kernel-boot guest (contrib/tiny-guest.sh), built once per build tree.
std::string tiny_guest_dir();

std::string toyvm_binary();  // the build's toyvm
std::string source_root();   // this source tree
bool accepts_connections(uint16_t port);  // on 127.0.0.1

// Runs a command to its end, its stdout and stderr kept apart in files under `dir`.
CommandResult run_command(const std::vector<std::string>& argv, const std::string& dir, double timeout_s = 60);

// Every process the test starts while it lives sees NAME=VALUE.
struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value) : name_(name) { setenv(name, value.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

inline size_t count_lines(const std::string& text) { return size_t(std::count(text.begin(), text.end(), '\n')); }
inline size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// "NOTIFIED TARGET, <rp>, OF INSTANCE <uuid>" -> {rp, uuid}; empty strings otherwise.
std::pair<std::string, std::string> parse_notified(const std::string& out);

// The host record of provider `rp` in etcd (its agent is alive), or nothing.
std::optional<HostRecord> host_record(const Servers& servers, const std::string& rp);
// How many domains the agent of provider `rp` has published in etcd.
int64_t published_domains(const Servers& servers, const std::string& rp);

}  // namespace toyvm::test

#include "harness_impl.hpp"
