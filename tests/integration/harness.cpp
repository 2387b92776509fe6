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

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "toyvm-test-XXXXXX").string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
  // QEMU on qemu:///system runs as its own user and must reach instance files in here.
  fs::permissions(path_, fs::perms(0755));
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!std::getenv("TOYVM_KEEP_TEST_DIRS")) fs::remove_all(path_, ec);
}

// Never one port twice: the kernel offers a port it just freed again (143 repeats in 2,000
// binds), and two servers given one port cannot both listen (seen: etcd's client and peer URLs).
uint16_t free_port() {
  static std::mutex mutex;
  static std::set<uint16_t> handed_out;
  std::lock_guard lock(mutex);
  while (true) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    const uint16_t port = ntohs(addr.sin_port);
    if (handed_out.insert(port).second) return port;
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Process::Process(std::vector<std::string> argv, std::string log_file) : log_file_(std::move(log_file)) {
  std::vector<char*> args;
  for (auto& arg : argv) args.push_back(arg.data());
  args.push_back(nullptr);
  pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // Never outlive the test run, even when it crashes.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);
    int fd = open(log_file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    execvp(args[0], args.data());
    _exit(127);
  }
}

Process::~Process() {
  if (running()) {
    signal(SIGKILL);
    wait(10);
  }
}

bool Process::running() {
  if (status_ != -1) return false;
  int status = 0;
  pid_t done = waitpid(pid_, &status, WNOHANG);
  if (done == pid_) {
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

void Process::signal(int sig) {
  if (status_ == -1) ::kill(-pid_, sig);
}

int Process::wait(double timeout_s) {
  wait_for([this] { return !running(); }, timeout_s);
  return status_;
}

bool wait_for(const std::function<bool()>& condition, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);  // polling interval, not a wait for an outcome
  }
}

std::string toyvm_binary() { return TOYVM_BINARY; }

namespace {

std::string source_root() { return TOYVM_SOURCE_ROOT; }

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

Servers::Servers(ServersOptions options) : etcd_(size_t(options.etcd_members)), options_(options) {
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
    // Short-lived tokens, so that the tests see toyvm renew them.
    if (options_.etcd_auth) argv.insert(argv.end(), {"--auth-token-ttl", "3"});
    etcd_[i].process = std::make_unique<Process>(std::move(argv), fmt::format("{}/etcd{}.log", dir(), i));
    config.etcd.endpoints.push_back(client_url);
  }
  config.etcd.timeout = std::chrono::seconds(3);
}

int Servers::kill_etcd_leader() {
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
      if (std::to_string(etcd_[i].client_port) == (*it)[1].str()) {
        etcd_[i].process->signal(SIGKILL);
        etcd_[i].process->wait();
        return int(i);
      }
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

CommandResult run_command(const std::vector<std::string>& argv, const std::string& dir, double timeout_s) {
  static int counter = 0;
  std::string base = dir + "/cmd-" + std::to_string(++counter);
  // stdout and stderr apart: a shell keeps them apart more simply than dup2 juggling here.
  std::string command;
  for (auto& arg : argv) command += "'" + arg + "' ";
  command += ">" + base + ".out 2>" + base + ".err";
  Process process({"/bin/sh", "-c", command}, base + ".log");
  CommandResult result;
  result.exit_code = process.wait(timeout_s);
  result.out = read_file(base + ".out");
  result.err = read_file(base + ".err");
  return result;
}

std::unique_ptr<Process> Servers::spawn_toyvm(std::vector<std::string> args, const std::string& log_name) const {
  return std::make_unique<Process>(toyvm_argv(std::move(args)), dir() + "/" + log_name);
}

std::unique_ptr<Process> Servers::start_compute(const std::string& name, const std::string& inventory,
                                                std::string* provider, std::vector<std::string> extra,
                                                const std::string& compute_toml) {
  std::vector<std::string> args;
  if (!compute_toml.empty()) {
    std::string file = dir() + "/" + name + ".toml";
    std::ofstream(file) << "[compute]\n" << compute_toml << "\n";
    args.insert(args.end(), {"--config", file});
  }
  bool uri_given = std::find(extra.begin(), extra.end(), "--libvirt-uri") != extra.end();
  args.insert(args.end(), {"compute", "--state-dir", dir() + "/" + name, "--inventory", inventory, "--name", name});
  if (!uri_given) args.insert(args.end(), {"--libvirt-uri", "test:///default"});
  args.insert(args.end(), extra.begin(), extra.end());
  auto process = spawn_toyvm(args, name + ".log");
  std::string uuid_file = dir() + "/" + name + "/provider_uuid";
  bool up = wait_for(
      [&] {
        std::string uuid = read_file(uuid_file);
        if (uuid.size() < 36) return false;
        uuid = uuid.substr(0, 36);
        return !etcd_prefix(KeyLayout().host(uuid)).empty();
      },
      30);
  if (!up) throw std::runtime_error("compute " + name + " did not come up: " + process->output());
  if (provider) *provider = read_file(uuid_file).substr(0, 36);
  return process;
}

std::vector<KeyValue> Servers::etcd_prefix(const std::string& prefix) const {
  return run_sync<std::vector<KeyValue>>([&](asio::io_context&) -> awaitable<std::vector<KeyValue>> {
    auto r = co_await etcd_client_->range_prefix(prefix);
    if (!r) throw std::runtime_error("etcd range failed: " + r.error().message());
    co_return r->kvs;
  });
}

void Servers::etcd_put(const std::string& key, const std::string& value) const {
  run_sync<bool>([&](asio::io_context&) -> awaitable<bool> {
    auto r = co_await etcd_client_->put(key, value);
    if (!r) throw std::runtime_error("etcd put failed");
    co_return true;
  });
}

void Servers::etcd_erase(const std::string& key) const {
  run_sync<bool>([&](asio::io_context&) -> awaitable<bool> {
    auto r = co_await etcd_client_->erase(key);
    if (!r) throw std::runtime_error("etcd delete failed");
    co_return true;
  });
}

int64_t Servers::etcd_compact() const {
  const int64_t revision = run_sync<int64_t>([&](asio::io_context&) -> awaitable<int64_t> {
    auto r = co_await etcd_client_->range("/");
    if (!r) throw std::runtime_error("etcd range failed: " + r.error().message());
    co_return r->revision;
  });
  auto compacted = run_command({"etcdctl", "--endpoints", config.etcd.endpoints.front(), "compact",
                                std::to_string(revision)},
                               dir());
  if (compacted.exit_code != 0) throw std::runtime_error("etcdctl compact failed: " + compacted.err);
  return revision;
}

ResourceAmounts Servers::usages(const std::string& provider) const {
  return run_sync<ResourceAmounts>([&](asio::io_context& io) -> awaitable<ResourceAmounts> {
    PlacementClient placement(io.get_executor(), config.placement);
    auto r = co_await placement.usages(provider);
    if (!r) throw std::runtime_error("usages failed: " + r.error().message());
    co_return *r;
  });
}

Allocations Servers::allocations(const std::string& consumer) const {
  return run_sync<Allocations>([&](asio::io_context& io) -> awaitable<Allocations> {
    PlacementClient placement(io.get_executor(), config.placement);
    auto r = co_await placement.allocations_of(consumer);
    if (!r) throw std::runtime_error("allocations failed: " + r.error().message());
    co_return *r;
  });
}

void Servers::claim(const std::string& consumer, const Allocations& allocations) const {
  run_sync<bool>([&](asio::io_context& io) -> awaitable<bool> {
    PlacementClient placement(io.get_executor(), config.placement);
    auto r = co_await placement.claim(consumer, allocations);
    if (!r) throw std::runtime_error("claim failed: " + r.error().message());
    co_return true;
  });
}

void Servers::move_books(const std::string& instance, const std::string& migration, const std::string& to) const {
  run_sync<bool>([&](asio::io_context& io) -> awaitable<bool> {
    PlacementClient placement(io.get_executor(), config.placement);
    auto held = co_await placement.consumer_allocations(instance);
    if (!held || held->allocations.size() != 1) throw std::runtime_error("move_books: the instance holds no one host");
    Allocations there{{to, held->allocations.begin()->second}};
    std::vector<ConsumerWrite> writes{{instance, std::move(there), held->generation, ConsumerType::instance},
                                      {migration, held->allocations, std::nullopt, ConsumerType::migration}};
    auto r = co_await placement.write_together(std::move(writes));
    if (!r) throw std::runtime_error("move_books failed: " + r.error().message());
    co_return true;
  });
}

void Servers::set_traits(const std::string& provider, std::vector<std::string> traits) const {
  run_sync<bool>([&](asio::io_context& io) -> awaitable<bool> {
    PlacementClient placement(io.get_executor(), config.placement);
    auto r = co_await placement.set_traits(provider, traits);
    if (!r) throw std::runtime_error("set_traits failed: " + r.error().message());
    co_return true;
  });
}

int Servers::provider_count() const {
  return run_sync<int>([&](asio::io_context& io) -> awaitable<int> {
    HttpClient http(io.get_executor(), placement_http_options());
    HttpRequest request{"GET", "/resource_providers", {{"X-Auth-Token", "admin"}}, {}};
    auto r = co_await http.request(std::move(request));
    if (!r || r->status != 200) throw std::runtime_error("listing providers failed");
    int count = 0;
    for (size_t pos = 0; (pos = r->body.find("\"uuid\"", pos)) != std::string::npos; ++pos) ++count;
    co_return count;
  });
}

std::string wait_for_state(const Servers& servers, const std::string& uuid, const std::string& state,
                           double timeout_s) {
  std::string last;
  wait_for(
      [&] {
        auto kvs = servers.etcd_prefix(KeyLayout().instance(uuid));
        if (kvs.empty()) return false;
        last = kvs.front().value;
        auto record = decode_instance(last);
        return record && to_string(record->state) == state;
      },
      timeout_s);
  return last;
}

std::optional<InstanceRecord> wait_for_record(const Servers& servers, const std::string& uuid,
                                              const std::function<bool(const InstanceRecord&)>& condition,
                                              double timeout_s) {
  std::optional<InstanceRecord> found;
  wait_for(
      [&] {
        auto kvs = servers.etcd_prefix(KeyLayout().instance(uuid));
        if (kvs.empty()) return false;
        auto record = decode_instance(kvs.front().value);
        if (!record || !condition(*record)) return false;
        found = std::move(*record);
        return true;
      },
      timeout_s);
  return found;
}

bool accepts_connections(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return ok;
}

FileServer::FileServer(const std::string& dir, const std::string& log_file, const std::string& pki)
    : port(free_port()), https(!pki.empty()) {
  std::string script = fmt::format(
      "import functools, http.server, ssl\n"
      "handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory='{}')\n"
      "server = http.server.ThreadingHTTPServer(('127.0.0.1', {}), handler)\n"
      "if '{}':\n"
      "    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n"
      "    tls.load_cert_chain('{}/server.crt', '{}/server.key')\n"
      "    server.socket = tls.wrap_socket(server.socket, server_side=True)\n"
      "server.serve_forever()\n",
      dir, port, pki, pki, pki);
  process = std::make_unique<Process>(std::vector<std::string>{"/usr/bin/python3", "-u", "-c", script}, log_file);
  if (!wait_for([&] { return accepts_connections(port); }, 20))
    throw std::runtime_error("http.server did not start: " + process->output());
}

std::string FileServer::url(const std::string& file) const {
  return fmt::format("{}://127.0.0.1:{}/{}", https ? "https" : "http", port, file);
}

int FileServer::requests_for(const std::string& file) const {
  std::string log = process->output();
  std::string needle = "\"GET /" + file + " ";
  int n = 0;
  for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) ++n;
  return n;
}

StallingServer::StallingServer(const std::string& log_file) : port(free_port()) {
  std::string script = fmt::format(
      "import socket, time\n"
      "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
      "s.bind(('127.0.0.1', {})); s.listen(16)\n"
      "held = []\n"
      "while True:\n"
      "    held.append(s.accept()[0])\n",
      port);
  process = std::make_unique<Process>(std::vector<std::string>{"/usr/bin/python3", "-c", script}, log_file);
  if (!wait_for([&] { return accepts_connections(port); }, 20))
    throw std::runtime_error("stalling server did not start: " + process->output());
}

std::string StallingServer::url() const { return fmt::format("http://127.0.0.1:{}/image.qcow2", port); }

void ensure_libvirtd() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::system((source_root() + "/contrib/start-libvirtd.sh").c_str()) != 0)
      throw std::runtime_error("contrib/start-libvirtd.sh failed");
  });
}

bool answers_ping(const std::string& ip, double timeout_s) {
  int fd = socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);
  if (fd < 0) return false;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  if (inet_pton(AF_INET, ip.c_str(), &to.sin_addr) != 1) {
    close(fd);
    return false;
  }
  // An echo request: type 8, code 0, its checksum over the 8 bytes, a fixed id and sequence.
  unsigned char request[8] = {8, 0, 0, 0, 0x70, 0x79, 0, 1};
  uint32_t sum = 0;
  for (int i = 0; i < 8; i += 2) sum += (request[i] << 8) | request[i + 1];
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  request[2] = uint8_t(~sum >> 8);
  request[3] = uint8_t(~sum);
  bool answered = false;
  if (sendto(fd, request, sizeof request, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) == sizeof request) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!answered && std::chrono::steady_clock::now() < deadline) {
      pollfd ready{fd, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (poll(&ready, 1, int(std::max<int64_t>(left.count(), 1))) <= 0) break;
      unsigned char reply[1500];
      sockaddr_in from{};
      socklen_t from_size = sizeof from;
      ssize_t n = recvfrom(fd, reply, sizeof reply, 0, reinterpret_cast<sockaddr*>(&from), &from_size);
      if (n < 28 || from.sin_addr.s_addr != to.sin_addr.s_addr) continue;
      const size_t header = size_t(reply[0] & 0x0f) * 4;  // the IP header comes with a raw socket
      answered = size_t(n) >= header + 8 && reply[header] == 0 && reply[header + 4] == 0x70 && reply[header + 5] == 0x79;
    }
  }
  close(fd);
  return answered;
}

namespace {
// The script's two lines: the second daemon as the first reaches it, and the first as the
// second does.
std::pair<std::string, std::string> second_libvirtd_uris() {
  static std::once_flag once;
  static std::pair<std::string, std::string> uris;
  std::call_once(once, [] {
    ensure_libvirtd();  // the second shares the first one's run dir, which the first makes
    TempDir dir;
    auto started = run_command({source_root() + "/contrib/second-libvirtd.sh", "start"}, dir.path(), 120);
    if (started.exit_code != 0) throw std::runtime_error("contrib/second-libvirtd.sh failed: " + started.err);
    std::istringstream lines(started.out);
    std::getline(lines, uris.first);
    std::getline(lines, uris.second);
  });
  return uris;
}
}  // namespace

std::string ensure_second_libvirtd() { return second_libvirtd_uris().first; }
std::string first_libvirtd_from_second() { return second_libvirtd_uris().second; }

void kill_and_restart_second_libvirtd() {
  ensure_second_libvirtd();
  const std::string pidfile = "/var/lib/toyvm-test/libvirtd-b/libvirtd.pid";  // the script's default DIR
  const pid_t pid = pid_t(std::atoi(read_file(pidfile).c_str()));
  if (pid <= 0 || kill(pid, SIGKILL) != 0) throw std::runtime_error("no second libvirtd to kill");
  if (!wait_for([&] { return kill(pid, 0) != 0; }, 30)) throw std::runtime_error("the second libvirtd lives on");
  TempDir dir;
  auto started = run_command({source_root() + "/contrib/second-libvirtd.sh", "start"}, dir.path(), 120);
  if (started.exit_code != 0) throw std::runtime_error("contrib/second-libvirtd.sh failed: " + started.err);
}

std::string tiny_guest_dir() {
  static std::once_flag once;
  static std::string dir = std::string(TOYVM_BUILD_ROOT) + "/tiny-guest";
  std::call_once(once, [] {
    std::string command = std::string(TOYVM_SOURCE_ROOT) + "/contrib/tiny-guest.sh '" + dir + "' >/dev/null";
    if (std::system(command.c_str()) != 0) throw std::runtime_error("contrib/tiny-guest.sh failed");
  });
  return dir;
}

std::optional<HostRecord> host_record(const Servers& servers, const std::string& rp) {
  auto kvs = servers.etcd_prefix(KeyLayout().host(rp));
  if (kvs.empty()) return std::nullopt;
  auto record = decode_host(kvs.front().value);
  return record ? std::optional<HostRecord>(*record) : std::nullopt;
}

int64_t published_domains(const Servers& servers, const std::string& rp) {
  return int64_t(servers.etcd_prefix(KeyLayout().domains_prefix(rp)).size());
}

std::pair<std::string, std::string> parse_notified(const std::string& out) {
  static const std::regex line("NOTIFIED TARGET, ([0-9a-f-]{36}), OF INSTANCE ([0-9a-f-]{36})");
  std::smatch m;
  if (!std::regex_search(out, m, line)) return {};
  return {m[1], m[2]};
}

}  // namespace toyvm::test
