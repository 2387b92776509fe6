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

TempDir::TempDir(std::string path) : path_(std::move(path)), kept_(true) {
  fs::create_directories(path_);
  fs::permissions(path_, fs::perms(0755));
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!kept_ && !std::getenv("TOYVM_KEEP_TEST_DIRS")) fs::remove_all(path_, ec);
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

bool port_bindable(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as servers bind theirs
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return bound;
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

std::string source_root() { return TOYVM_SOURCE_ROOT; }

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
  return int(count_of(process->output(), "\"GET /" + file + " "));
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
