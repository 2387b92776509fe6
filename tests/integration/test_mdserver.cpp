// toyvm mdserver against a real etcd: per-guest answers by source address, live updates,
// and requests that try to break it.

#include "harness.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"

#include "catch_result.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>

using namespace toyvm;
using namespace toyvm::test;

namespace {

const std::string host = "aaaaaaaa-0000-4000-8000-00000000000a";
const std::string vm_a = "11111111-0000-4000-8000-000000000001";
const std::string vm_b = "22222222-0000-4000-8000-000000000002";

// A TCP connection from a chosen loopback source address, so one test can be many guests.
class Client {
 public:
  Client(const std::string& source, uint16_t port, const std::string& target = "127.0.0.1") {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    inet_pton(AF_INET, source.c_str(), &local.sin_addr);
    bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local);
    sockaddr_in remote{};
    remote.sin_family = AF_INET;
    remote.sin_port = htons(port);
    inet_pton(AF_INET, target.c_str(), &remote.sin_addr);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&remote), sizeof remote) == 0;
  }
  ~Client() { close(fd_); }
  bool connected() const { return connected_; }

  void send_raw(const std::string& bytes) { (void)::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }

  // Reads until the peer closes or `timeout_s` passes; returns what arrived.
  std::string read_until_closed(double timeout_s, bool* closed = nullptr) {
    std::string out;
    char buf[4096];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        if (closed) *closed = true;
        return out;
      }
      out.append(buf, size_t(n));
    }
    if (closed) *closed = false;
    return out;
  }

  // One GET with Connection: close; returns {status, body}.
  std::pair<int, std::string> get(const std::string& path) {
    send_raw("GET " + path + " HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n\r\n");
    std::string response = read_until_closed(10);
    if (response.size() < 12) return {0, {}};
    int status = std::stoi(response.substr(9, 3));
    size_t body = response.find("\r\n\r\n");
    return {status, body == std::string::npos ? "" : response.substr(body + 4)};
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::pair<int, std::string> get_from(const std::string& source, uint16_t port, const std::string& path,
                                     const std::string& target = "127.0.0.1") {
  Client client(source, port, target);
  return client.get(path);
}

void put_instance(const Servers& servers, const std::string& uuid, const std::string& name,
                  const std::string& ip, const std::string& user_data) {
  WorkSpec spec;
  spec.uuid = uuid;
  spec.name = name;
  spec.user_data = user_data;
  spec.keys = {{name + "-key", "ssh-ed25519 AAAA " + name}};
  InstanceRecord record;
  record.uuid = uuid;
  record.host = host;
  record.state = InstanceState::active;
  record.ip = ip;
  servers.etcd_put(KeyLayout().work(host, uuid), encode(spec));
  servers.etcd_put(KeyLayout().instance(uuid), encode(record));
}

struct Mdserver {
  uint16_t port = free_port();
  std::unique_ptr<Process> process;

  // Tests poll in tight loops, so the per-source limit is off unless a test sets one.
  explicit Mdserver(const Servers& servers, const std::string& extra_config = "rate_limit = 0\n") {
    std::string config = servers.dir() + "/md.toml";
    std::ofstream(config) << "[mdserver]\nidle_timeout = 1.0\nmax_connections = 300\n" << extra_config;
    process = servers.spawn_toyvm({"--config", config, "mdserver", "--listen", "127.0.0.1:" + std::to_string(port)},
                                  "mdserver.log");
    REQUIRE(wait_for([&] { return Client("127.0.0.1", port).connected(); }, 10));
  }
};

}  // namespace

TEST_CASE("each guest sees only its own metadata, and changes show up live", "[mdserver]") {
  Servers servers;
  put_instance(servers, vm_a, "alpha", "127.0.0.2", "#cloud-config\nhostname: alpha\n");
  put_instance(servers, vm_b, "beta", "127.0.0.3", "");
  Mdserver md(servers);

  REQUIRE(wait_for([&] { return get_from("127.0.0.2", md.port, "/latest/meta-data/instance-id").first == 200; }, 10));
  CHECK(get_from("127.0.0.2", md.port, "/latest/meta-data/instance-id").second == vm_a);
  CHECK(get_from("127.0.0.3", md.port, "/latest/meta-data/instance-id").second == vm_b);
  CHECK(get_from("127.0.0.2", md.port, "/latest/user-data").second == "#cloud-config\nhostname: alpha\n");
  CHECK(get_from("127.0.0.3", md.port, "/latest/user-data").first == 404);
  auto meta = get_from("127.0.0.3", md.port, "/openstack/latest/meta_data.json");
  CHECK(meta.first == 200);
  CHECK_THAT(meta.second, Catch::Contains("\"uuid\":\"" + vm_b + "\""));
  CHECK_THAT(meta.second, Catch::Contains("beta-key"));
  CHECK_THAT(meta.second, !Catch::Contains("alpha"));
  CHECK(get_from("127.0.0.2", md.port, "/latest/meta-data/public-keys/0/openssh-key").second ==
        "ssh-ed25519 AAAA alpha\n");
  // An address no instance has gets nothing at all.
  CHECK(get_from("127.0.0.4", md.port, "/latest/meta-data/instance-id").first == 404);
  CHECK(get_from("127.0.0.4", md.port, "/openstack").first == 404);

  SECTION("a new instance appears") {
    const std::string vm_c = "33333333-0000-4000-8000-000000000003";
    put_instance(servers, vm_c, "gamma", "127.0.0.4", "");
    CHECK(wait_for([&] { return get_from("127.0.0.4", md.port, "/latest/meta-data/instance-id").second == vm_c; }, 10));
  }
  SECTION("a changed instance changes") {
    put_instance(servers, vm_a, "alpha", "127.0.0.2", "#cloud-config\nhostname: renamed\n");
    CHECK(wait_for([&] { return get_from("127.0.0.2", md.port, "/latest/user-data").second ==
                                "#cloud-config\nhostname: renamed\n"; }, 10));
  }
  SECTION("an instance gone to ERROR is no longer served at its old address") {
    InstanceRecord crashed;
    crashed.uuid = vm_a;
    crashed.host = host;
    crashed.state = InstanceState::error;
    crashed.ip = "127.0.0.2";
    crashed.error_code = "launch_failure";
    servers.etcd_put(KeyLayout().instance(vm_a), encode(crashed));
    CHECK(wait_for([&] { return get_from("127.0.0.2", md.port, "/latest/meta-data/instance-id").first == 404; }, 10));
    // The address can be another guest's now, and that guest gets its own data.
    const std::string vm_c = "33333333-0000-4000-8000-000000000003";
    put_instance(servers, vm_c, "gamma", "127.0.0.2", "");
    CHECK(wait_for([&] { return get_from("127.0.0.2", md.port, "/latest/meta-data/instance-id").second == vm_c; }, 10));
  }
  SECTION("a destroyed instance disappears") {
    run_sync<bool>([&](asio::io_context&) -> awaitable<bool> {
      auto etcd = EtcdClient::create(servers.config.etcd);
      co_await etcd->erase(KeyLayout().instance(vm_a));
      co_await etcd->erase(KeyLayout().work(host, vm_a));
      co_return true;
    });
    CHECK(wait_for([&] { return get_from("127.0.0.2", md.port, "/latest/meta-data/instance-id").first == 404; }, 10));
    CHECK(get_from("127.0.0.3", md.port, "/latest/meta-data/instance-id").second == vm_b);
  }
  CHECK(md.process->running());
}

TEST_CASE("bad requests get 4xx or a closed connection, and others are still served", "[mdserver]") {
  Servers servers;
  put_instance(servers, vm_a, "alpha", "127.0.0.2", "data");
  Mdserver md(servers);
  REQUIRE(wait_for([&] { return get_from("127.0.0.2", md.port, "/latest/meta-data/instance-id").first == 200; }, 10));

  SECTION("unknown paths, traversal and wrong methods") {
    CHECK(get_from("127.0.0.2", md.port, "/latest/meta-data/nothing").first == 404);
    CHECK(get_from("127.0.0.2", md.port, "/latest/../../etc/passwd").first == 400);
    CHECK(get_from("127.0.0.2", md.port, "/openstack/latest/../latest/meta_data.json").first == 400);
    Client post("127.0.0.2", md.port);
    post.send_raw("POST /latest/meta-data/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
    CHECK_THAT(post.read_until_closed(5), Catch::StartsWith("HTTP/1.1 405"));
    Client garbage("127.0.0.2", md.port);
    garbage.send_raw("\x16\x03\x01 not http at all\r\n\r\n");
    bool closed = false;
    CHECK_THAT(garbage.read_until_closed(5, &closed), Catch::StartsWith("HTTP/1.1 400"));
    CHECK(closed);
  }
  SECTION("huge headers") {
    Client big("127.0.0.2", md.port);
    big.send_raw("GET /latest/meta-data/instance-id HTTP/1.1\r\nHost: x\r\nX-Junk: " + std::string(64 * 1024, 'a') +
                 "\r\n\r\n");
    bool closed = false;
    CHECK_THAT(big.read_until_closed(5, &closed), Catch::StartsWith("HTTP/1.1 431"));
    CHECK(closed);
  }
  SECTION("a slow client is cut off") {
    Client slow("127.0.0.2", md.port);
    slow.send_raw("GET /latest/meta-data/inst");  // and never finishes
    bool closed = false;
    slow.read_until_closed(10, &closed);
    CHECK(closed);
  }
  SECTION("a flood of idle connections does not stop others being served") {
    std::vector<std::unique_ptr<Client>> flood;
    for (int i = 0; i < 400; ++i) flood.push_back(std::make_unique<Client>("127.0.0.9", md.port));
    // Over max_connections (300) the server closes new connections; idle ones time out.
    CHECK(wait_for([&] { return get_from("127.0.0.2", md.port, "/latest/meta-data/instance-id").first == 200; }, 10));
  }
  CHECK(md.process->running());
  CHECK(get_from("127.0.0.2", md.port, "/latest/meta-data/instance-id").second == vm_a);
}

// Each host's NAT network hands out the same subnet, so guests of different hosts share
// addresses (the test driver gives the first guest of each agent the same one): each agent
// serves its own guests, and only them, from its own event loop.
TEST_CASE("two hosts whose guests share an address: each agent answers its own guest only", "[mdserver]") {
  Servers servers;
  // The test speaks from the guests' address, put on lo. The metadata address is in the
  // guests' subnet too: libvirt's default network masquerades what this machine sends from
  // that subnet elsewhere, which would hide the source.
  const std::string address = "192.168.122.254";
  std::string guest_ip;  // put on lo so that the test can speak from it
  struct Cleanup {
    const std::string& address;
    const std::string& guest_ip;
    ~Cleanup() {
      for (const std::string* ip : {&address, &guest_ip})
        if (!ip->empty()) std::system(("ip addr del " + *ip + "/32 dev lo 2>/dev/null").c_str());
    }
  } cleanup{address, guest_ip};
  struct Host {
    std::string name, trait, provider, listen;
    uint16_t port = free_port();
    std::unique_ptr<Process> process;
    std::string uuid;
  };
  std::vector<Host> hosts(2);
  hosts[0].name = "a", hosts[0].trait = "CUSTOM_HOST_A";
  hosts[1].name = "b", hosts[1].trait = "CUSTOM_HOST_B";
  for (Host& host : hosts) {
    host.listen = address + ":" + std::to_string(host.port);
    host.process = servers.start_compute(host.name, "VCPU:4,DISK_GB:10,MEMORY_MB:1024", &host.provider,
                                         {"--trait", host.trait},
                                         "metadata_interface = \"lo\"\n[mdserver]\nrate_limit = 0\nlisten = [\"" +
                                             host.listen + "\"]\n");
    std::string user_data = servers.dir() + "/" + host.name + ".user-data";
    std::ofstream(user_data) << "#cloud-config\nhostname: guest-of-" << host.name << "\n";
    auto scheduled = servers.toyvm({"schedule", "resources=VCPU:1,MEMORY_MB:64&required=" + host.trait, "--name", "guest-of-" + host.name, "--user-data", user_data});
    REQUIRE(scheduled.exit_code == 0);
    host.uuid = parse_notified(scheduled.out).second;
  }
  std::vector<std::string> ips;
  for (Host& host : hosts) {
    auto record = wait_for_record(servers, host.uuid, [](const InstanceRecord& r) { return !r.ip.empty(); });
    REQUIRE(record.has_value());
    ips.push_back(record->ip);
    CHECK_THAT(host.process->output(), Catch::Contains("serving metadata on " + host.listen + " (lo)"));
  }
  INFO("guest addresses " << ips[0] << " and " << ips[1]);
  REQUIRE(ips[0] == ips[1]);
  guest_ip = ips[0];
  REQUIRE(std::system(("ip addr add " + guest_ip + "/32 dev lo").c_str()) == 0);

  for (Host& host : hosts) {
    INFO(host.process->output());
    CHECK(get_from(guest_ip, host.port, "/latest/meta-data/instance-id", address) == std::pair{200, host.uuid});
    CHECK(get_from(guest_ip, host.port, "/latest/user-data", address).second ==
          "#cloud-config\nhostname: guest-of-" + host.name + "\n");
    // Another address of the same machine is no guest of this host.
    CHECK(get_from(address, host.port, "/latest/meta-data/instance-id", address).first == 404);
  }

  // Destroyed, the guest is forgotten at once; the other host's guest is still served.
  REQUIRE(servers.toyvm({"destroy", hosts[0].uuid}).exit_code == 0);
  CHECK(get_from(guest_ip, hosts[0].port, "/latest/meta-data/instance-id", address).first == 404);
  CHECK(get_from(guest_ip, hosts[1].port, "/latest/meta-data/instance-id", address).second == hosts[1].uuid);
}

TEST_CASE("only guest networks are answered, and a flooding source is limited while others are served",
          "[mdserver]") {
  Servers servers;
  put_instance(servers, vm_a, "alpha", "127.0.0.2", "");
  put_instance(servers, vm_b, "beta", "127.0.0.3", "");
  put_instance(servers, "33333333-0000-4000-8000-000000000003", "outside", "127.0.0.200", "");
  Mdserver md(servers, "guest_networks = [\"127.0.0.0/28\"]\nrate_limit = 5\nrate_burst = 10\n");
  REQUIRE(wait_for([&] { return get_from("127.0.0.3", md.port, "/latest/meta-data/instance-id").first == 200; }, 10));

  // A known instance outside the guest networks still gets nothing.
  CHECK(get_from("127.0.0.200", md.port, "/latest/meta-data/instance-id").first == 403);

  int limited = 0;
  for (int i = 0; i < 40; ++i) limited += get_from("127.0.0.2", md.port, "/latest/meta-data/instance-id").first == 429;
  CHECK(limited >= 20);  // 40 requests at once against a burst of 10 and 5/s
  CHECK(get_from("127.0.0.3", md.port, "/latest/meta-data/instance-id").second == vm_b);
  CHECK(md.process->running());
}
