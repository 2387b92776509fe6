// Servers: etcd (one member or a cluster), Placement on PostgreSQL, Keystone, each on its own
// ports and directory, started, stopped and started again by the tests.

#include "harness.hpp"

#include "model/keys.hpp"
#include "model/records.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <algorithm>
#include <mutex>
#include <thread>

namespace toyvm::test {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

// Creating Placement's schema takes seconds; every test copies one prepared database.
const std::string& placement_template() {
  static TempDir dir;
  static std::string db = [] {
    std::string setup = source_root() + "/contrib/placement-setup.sh";
    std::string command = setup + " " + dir.path() + " 1 >" + dir.path() + "/setup.log 2>&1";
    if (std::system(command.c_str()) != 0)
      throw std::runtime_error("placement-setup.sh failed: " + read_file(dir.path() + "/setup.log"));
    return dir.path() + "/placement.sqlite";
  }();
  return db;
}

}  // namespace

namespace {

void run_or_throw(const std::string& command) {
  if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
}

}  // namespace

void make_client_certificate(const std::string& pki, const std::string& cn) {
  std::string in = "cd '" + pki + "' && ";
  run_or_throw(in + "openssl req -newkey rsa:2048 -nodes -keyout " + cn + ".key -out " + cn + ".csr -subj /CN=" + cn +
               " 2>/dev/null");
  run_or_throw(in + "openssl x509 -req -in " + cn + ".csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out " + cn +
               ".crt 2>/dev/null");
}

namespace {

// openssl's `ca`, for what `x509 -req` cannot do: backdated certificates and revocation lists.
std::string ca_command(const std::string& pki) {
  if (!fs::exists(pki + "/ca.cnf")) {
    std::ofstream(pki + "/ca.cnf") << "[ca]\ndefault_ca = test\n[test]\ndir = .\ndatabase = index.txt\n"
                                      "new_certs_dir = issued\ncertificate = ca.crt\nprivate_key = ca.key\n"
                                      "serial = ca.serial\ncrlnumber = crlnumber\ndefault_md = sha256\n"
                                      "default_crl_days = 2\npolicy = any\n[any]\ncommonName = supplied\n";
    std::ofstream(pki + "/index.txt") << "";
    std::ofstream(pki + "/crlnumber") << "1000\n";
    std::ofstream(pki + "/ca.serial") << "5000\n";
    fs::create_directories(pki + "/issued");
  }
  return "cd '" + pki + "' && openssl ca -config ca.cnf -batch ";
}

}  // namespace

void make_expired_client_certificate(const std::string& pki, const std::string& cn) {
  std::string in = "cd '" + pki + "' && ";
  run_or_throw(in + "openssl req -newkey rsa:2048 -nodes -keyout " + cn + ".key -out " + cn + ".csr -subj /CN=" + cn +
               " 2>/dev/null");
  run_or_throw(ca_command(pki) + "-notext -startdate 20200101000000Z -enddate 20200102000000Z -in " + cn +
               ".csr -out " + cn + ".crt 2>/dev/null");
}

void write_revocation_list(const std::string& pki, const std::vector<std::string>& revoked) {
  for (const std::string& cn : revoked) run_or_throw(ca_command(pki) + "-revoke " + cn + ".crt 2>/dev/null");
  run_or_throw(ca_command(pki) + "-gencrl -out crl.pem.new 2>/dev/null && mv crl.pem.new crl.pem");
}

void make_certificates(const std::string& pki) {
  fs::create_directories(pki);
  std::string in = "cd '" + pki + "' && ";
  auto key_and_csr = [&](const std::string& name, const std::string& cn) {
    run_or_throw(in + "openssl req -newkey rsa:2048 -nodes -keyout " + name + ".key -out " + name +
                 ".csr -subj /CN=" + cn + " 2>/dev/null");
  };
  for (const char* ca : {"ca", "other-ca"})
    run_or_throw(in + "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout " + ca + ".key -out " + ca +
                 ".crt -subj /CN=toyvm-test-" + ca + " 2>/dev/null");
  key_and_csr("server", "etcd");
  key_and_csr("client", "root");
  std::ofstream(pki + "/server.ext") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  run_or_throw(in + "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
                    "-extfile server.ext -out server.crt 2>/dev/null");
  run_or_throw(in + "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
                    "-out client.crt 2>/dev/null");
}

Servers::Servers(ServersOptions options)
    : dir_(options.dir.empty() ? TempDir() : TempDir(options.dir)),
      etcd_(size_t(options.etcd_members)),
      options_(options) {
  if (options_.postgresql) start_postgresql();
  if (options_.etcd_tls || options_.placement_https) make_certificates(pki());
  if (options_.etcd_tls) {
    config.etcd.ca_file = pki() + "/ca.crt";
    config.etcd.cert_file = pki() + "/client.crt";
    config.etcd.key_file = pki() + "/client.key";
  }
  start_etcd();
  if (options_.keystone_token_s > 0) start_keystone();
  start_placement();
  etcd_client_ = EtcdClient::create(config.etcd);
  if (!etcd_answers(30)) throw std::runtime_error("etcd did not start: " + read_file(dir() + "/etcd0.log"));
  if (options_.etcd_auth) {
    std::string etcdctl = fmt::format("ETCDCTL_API=3 etcdctl --endpoints={}", fmt::join(config.etcd.endpoints, ","));
    if (options_.etcd_tls)
      etcdctl += fmt::format(" --cacert={} --cert={} --key={}", config.etcd.ca_file, config.etcd.cert_file,
                             config.etcd.key_file);
    run_or_throw(etcdctl + " user add root:secret-pw >/dev/null");
    std::system((etcdctl + " role add root >/dev/null 2>&1").c_str());
    run_or_throw(etcdctl + " user grant-role root root >/dev/null");
    run_or_throw(etcdctl + " auth enable >/dev/null");
    config.etcd.user = "root";
    config.etcd.password = "secret-pw";
    etcd_client_ = EtcdClient::create(config.etcd);
  }
  if (options_.etcd_tls || options_.etcd_auth || options_.placement_https || options_.keystone_token_s > 0) {
    secure_config = dir() + "/secure.toml";
    std::ofstream out(secure_config);
    out << "[etcd]\n";
    for (auto [key, value] : {std::pair{"ca_file", config.etcd.ca_file}, std::pair{"cert_file", config.etcd.cert_file},
                              std::pair{"key_file", config.etcd.key_file}, std::pair{"user", config.etcd.user},
                              std::pair{"password", config.etcd.password}})
      if (!value.empty()) out << key << " = '" << value << "'\n";
    out << "[placement]\n";
    for (auto [key, value] : {std::pair{"ca_file", config.placement.ca_file}, std::pair{"auth_url", config.placement.auth_url},
                              std::pair{"user", config.placement.user}, std::pair{"password", config.placement.password},
                              std::pair{"project", config.placement.project}})
      if (!value.empty()) out << key << " = '" << value << "'\n";
    out.close();
    fs::permissions(secure_config, fs::perms(0600));
  }
  if (!placement_answers(30))
    throw std::runtime_error("Placement did not start: " + read_file(dir() + "/placement/uwsgi.log"));
}

bool Servers::etcd_answers(double timeout_s) const {
  return wait_for(
      [&] {
        return run_sync<bool>([&](asio::io_context&) -> awaitable<bool> {
          auto r = co_await etcd_client_->range("probe");
          co_return bool(r);
        });
      },
      timeout_s);
}

bool Servers::placement_answers(double timeout_s) const {
  return wait_for(
      [&] {
        return run_sync<bool>([&](asio::io_context& io) -> awaitable<bool> {
          HttpClient http(io.get_executor(), placement_http_options());
          HttpRequest request{"GET", "/", {}, {}};
          auto r = co_await http.request(std::move(request));
          co_return r && r->status == 200;
        });
      },
      timeout_s);
}

Servers::~Servers() = default;

void Servers::start_etcd() {
  std::string cluster;
  for (size_t i = 0; i < etcd_.size(); ++i) {
    if (!etcd_[i].client_port) etcd_[i].client_port = free_port();
    if (!etcd_[i].peer_port) etcd_[i].peer_port = free_port();
    cluster += (i ? "," : "") + fmt::format("n{}=http://127.0.0.1:{}", i, etcd_[i].peer_port);
  }
  config.etcd.endpoints.clear();
  for (size_t i = 0; i < etcd_.size(); ++i) {
    std::string client_url =
        fmt::format("{}://127.0.0.1:{}", options_.etcd_tls ? "https" : "http", etcd_[i].client_port);
    std::string peer_url = fmt::format("http://127.0.0.1:{}", etcd_[i].peer_port);
    std::vector<std::string> argv{"etcd", "--name", fmt::format("n{}", i), "--data-dir", fmt::format("{}/etcd{}", dir(), i),
                                  "--logger=zap", "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                                  "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                                  "--initial-cluster", cluster, "--initial-cluster-token", "toyvm-test"};
    if (options_.etcd_tls)
      argv.insert(argv.end(), {"--cert-file", pki() + "/server.crt", "--key-file", pki() + "/server.key",
                               "--trusted-ca-file", pki() + "/ca.crt", "--client-cert-auth"});
    if (options_.etcd_tls && options_.etcd_crl) {
      if (!fs::exists(pki() + "/crl.pem")) write_revocation_list(pki(), {});
      argv.insert(argv.end(), {"--client-crl-file", pki() + "/crl.pem"});
    }
    // Short-lived tokens, so that the tests see toyvm renew them.
    if (options_.etcd_auth) argv.insert(argv.end(), {"--auth-token-ttl", "3"});
    argv.insert(argv.end(), options_.etcd_args.begin(), options_.etcd_args.end());
    etcd_[i].process = std::make_unique<Process>(std::move(argv), fmt::format("{}/etcd{}.log", dir(), i));
    config.etcd.endpoints.push_back(client_url);
  }
  config.etcd.timeout = std::chrono::seconds(3);
}

int Servers::kill_etcd_leader() {
  const int leader = etcd_leader();
  etcd_[size_t(leader)].process->signal(SIGKILL);
  etcd_[size_t(leader)].process->wait();
  return leader;
}

int Servers::etcd_leader() const {
  std::string endpoints = fmt::format("{}", fmt::join(config.etcd.endpoints, ","));
  std::string out = dir() + "/status.json";
  std::system(("ETCDCTL_API=3 etcdctl --endpoints=" + endpoints + " endpoint status -w json > " + out + " 2>/dev/null").c_str());
  std::string status = read_file(out);
  // [{"Endpoint":"http://127.0.0.1:P","Status":{"header":{...,"member_id":M,...},...,"leader":L,...}}, ...]
  std::smatch leader;
  if (!std::regex_search(status, leader, std::regex("\"leader\":(\\d+)"))) throw std::runtime_error("no etcd leader: " + status);
  std::regex entry("\"Endpoint\":\"http://127\\.0\\.0\\.1:(\\d+)\",\"Status\":\\{\"header\":\\{[^}]*\"member_id\":(\\d+)");
  for (auto it = std::sregex_iterator(status.begin(), status.end(), entry); it != std::sregex_iterator(); ++it) {
    if ((*it)[2] != leader[1]) continue;
    for (size_t i = 0; i < etcd_.size(); ++i) {
      if (std::to_string(etcd_[i].client_port) == (*it)[1].str()) return int(i);
    }
  }
  throw std::runtime_error("leader not found in: " + status);
}

void Servers::start_keystone() {
  uint16_t port = free_port();
  std::string kdir = dir() + "/keystone";
  std::string command = fmt::format("{}/contrib/keystone-setup.sh {} {} keystone-pw {}", source_root(), kdir, port,
                                    options_.keystone_token_s);
  if (std::system(command.c_str()) != 0)
    throw std::runtime_error("keystone-setup.sh failed: " + read_file(kdir + "/setup.log"));
  keystone_ = std::make_unique<Process>(std::vector<std::string>{"uwsgi", "--ini", kdir + "/uwsgi.ini"},
                                        dir() + "/keystone-console.log");
  config.placement.auth_url = fmt::format("http://127.0.0.1:{}/v3", port);
  config.placement.user = "admin";
  config.placement.password = "keystone-pw";
  config.placement.project = "admin";
  config.placement.token.clear();
  bool up = wait_for([&] {
    return run_sync<bool>([&](asio::io_context& io) -> awaitable<bool> {
      HttpClient http(io.get_executor(), HttpClientOptions{config.placement.auth_url});
      HttpRequest request{"GET", "/", {}, {}};
      auto r = co_await http.request(std::move(request));
      co_return r && r->status == 200;
    });
  }, 60);
  if (!up) throw std::runtime_error("Keystone did not start: " + read_file(kdir + "/uwsgi.log"));
}

void Servers::start_placement() {
  placement_port_ = placement_port_ ? placement_port_ : free_port();
  std::string pdir = dir() + "/placement";
  std::string keystone_env = config.placement.auth_url.empty()
                                 ? ""
                                 : fmt::format("KEYSTONE_URL={} KEYSTONE_ADMIN_PASSWORD={} ", config.placement.auth_url,
                                               config.placement.password);
  std::string command = keystone_env + source_root() + "/contrib/placement-setup.sh " + pdir + " " +
                        std::to_string(placement_port_) + " " +
                        (database_url_.empty() ? placement_template() : "''") + " " +
                        std::to_string(options_.placement_workers) + " '" + database_url_ + "'";
  if (std::system(command.c_str()) != 0) throw std::runtime_error("placement-setup.sh failed");
  placement_ = std::make_unique<Process>(std::vector<std::string>{"uwsgi", "--ini", pdir + "/uwsgi.ini"},
                                         dir() + "/uwsgi-console.log");
  config.placement.endpoint = "http://127.0.0.1:" + std::to_string(placement_port_);
  config.placement.timeout = std::chrono::seconds(5);
  if (options_.placement_https) {
    // HTTPS in front of the same workers, as a TLS-terminating proxy would be.
    uint16_t port = free_port();
    placement_tls_ = std::make_unique<Process>(
        std::vector<std::string>{"uwsgi", "--plugins", "http", "--master", "--https",
                                 fmt::format("127.0.0.1:{},{}/server.crt,{}/server.key", port, pki(), pki()),
                                 "--http-to", pdir + "/uwsgi.sock", "--http-keepalive"},
        dir() + "/uwsgi-https.log");
    config.placement.endpoint = fmt::format("https://127.0.0.1:{}", port);
    config.placement.ca_file = pki() + "/ca.crt";
  }
}

// A private PostgreSQL cluster (Debian's server binaries) owned by the postgres user, which
// initdb insists on; trust authentication on loopback only.
void Servers::start_postgresql() {
  std::string bin;
  for (const char* version : {"15", "16", "14", "13"}) {
    if (std::filesystem::exists(std::string("/usr/lib/postgresql/") + version + "/bin/initdb")) {
      bin = std::string("/usr/lib/postgresql/") + version + "/bin";
      break;
    }
  }
  if (bin.empty()) throw std::runtime_error("PostgreSQL is not installed (contrib/install-deps.sh installs it)");
  std::string data = dir() + "/pg";
  uint16_t port = free_port();
  std::string as_postgres = "runuser -u postgres -- ";
  std::string setup = "chmod 755 " + dir() + " && mkdir -p " + data + " && chown postgres " + data + " && " +
                      as_postgres + bin + "/initdb -D " + data + " -A trust -U postgres >" + dir() + "/initdb.log 2>&1";
  if (std::system(setup.c_str()) != 0) throw std::runtime_error("initdb failed: " + read_file(dir() + "/initdb.log"));
  postgres_ = std::make_unique<Process>(
      std::vector<std::string>{"runuser", "-u", "postgres", "--", bin + "/postgres", "-D", data, "-p",
                               std::to_string(port), "-h", "127.0.0.1", "-k", data, "-c", "max_connections=200"},
      dir() + "/postgres.log");
  std::string ready = bin + "/pg_isready -q -h 127.0.0.1 -p " + std::to_string(port);
  if (!wait_for([&] { return std::system(ready.c_str()) == 0; }, 30))
    throw std::runtime_error("PostgreSQL did not start: " + read_file(dir() + "/postgres.log"));
  std::string create = "runuser -u postgres -- psql -q -h 127.0.0.1 -p " + std::to_string(port) +
                       " -c 'CREATE DATABASE placement' >/dev/null";
  if (std::system(create.c_str()) != 0) throw std::runtime_error("creating the placement database failed");
  database_url_ = "postgresql+psycopg2://postgres@127.0.0.1:" + std::to_string(port) + "/placement";
}

void Servers::stop_etcd(int signal) {
  for (auto& member : etcd_) {
    member.process->signal(signal);
    member.process->wait();
  }
}

void Servers::stop_etcd_member(size_t index) {
  etcd_.at(index).process->signal(SIGKILL);
  etcd_.at(index).process->wait();
}

// uWSGI's master and workers at once: a graceful stop waits up to a minute for a worker
// that is still loading the application (lazy-apps), and a crash is what the tests mean.
void Servers::stop_placement() {
  placement_->signal(SIGKILL);
  placement_->wait();
  // A worker killed in the middle of a disk write holds the port until the write ends, and a
  // Placement started meanwhile could not listen on it.
  if (!wait_for([&] { return port_bindable(placement_port_); }, 30))
    throw std::runtime_error("Placement's port is still taken after it was killed");
}

void Servers::start_etcd_again() {
  start_etcd();
  if (!etcd_answers(30)) throw std::runtime_error("etcd did not come back");
}

void Servers::start_placement_again() {
  std::string pdir = dir() + "/placement";
  placement_ = std::make_unique<Process>(std::vector<std::string>{"uwsgi", "--ini", pdir + "/uwsgi.ini"},
                                         dir() + "/uwsgi-console-again.log");
  if (!placement_answers(30)) throw std::runtime_error("Placement did not come back");
}

std::vector<std::string> Servers::toyvm_argv(std::vector<std::string> args) const {
  std::vector<std::string> argv{toyvm_binary(), "--etcd", fmt::format("{}", fmt::join(config.etcd.endpoints, ",")),
                                "--placement",
                                config.placement.endpoint};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

CommandResult Servers::toyvm(std::vector<std::string> args, double timeout_s) const {
  return run_command(toyvm_argv(std::move(args)), dir(), timeout_s);
}

}  // namespace toyvm::test
