// A real distribution's guest: Debian 12 as contrib/debian-image.sh builds it from Debian's
// packages, with Debian's own cloud-init, booted under TCG through qemu:///system. What the
// guest does with toyvm's metadata is checked from inside it, over ssh with a key it was given.

#include "harness.hpp"
#include "model/metadata.hpp"
#include "model/records.hpp"

#include "catch_result.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

using namespace toyvm;
using namespace toyvm::test;
namespace fs = std::filesystem;

namespace {

const std::string flavor = "resources=VCPU:1,MEMORY_MB:512,DISK_GB:3";
constexpr double boot_timeout_s = 600;  // Debian, systemd and cloud-init under TCG on 2 busy cores

// Debian's cloud-init package, unpacked (not installed) for its python modules.
std::string cloud_init_python_path() {
  static std::once_flag once;
  static std::string root = std::string(TOYVM_BUILD_ROOT) + "/cloud-init-package";
  std::call_once(once, [] {
    if (fs::exists(root + "/usr/lib/python3/dist-packages/cloudinit")) return;
    TempDir work;
    fs::permissions(work.path(), fs::perms::all);  // apt-get download drops to the _apt user
    auto got = run_command({"/bin/sh", "-c",
                            "cd '" + work.path() + "' && apt-get download -qq cloud-init && "
                            "dpkg-deb -x cloud-init_*.deb '" + root + "'"},
                           work.path(), 300);
    if (got.exit_code != 0) throw std::runtime_error("cannot unpack Debian's cloud-init: " + got.err);
  });
  return root + "/usr/lib/python3/dist-packages";
}

// What cloud-init 's own converter makes of `network_data` (as its OpenStack datasource and
// its config drive reader do), rendered by its ifupdown renderer, for a guest whose NIC with
// `mac` is called ens2.
std::string cloud_init_renders(const std::string& network_data, const std::string& mac) {
  TempDir dir;
  std::ofstream(dir.path() + "/network_data.json") << network_data;
  const std::string script =
      "import json, sys\n"
      "from cloudinit.sources.helpers import openstack\n"
      "from cloudinit.net import eni, network_state\n"
      "data = json.load(open(sys.argv[1]))\n"
      "config = openstack.convert_net_json(data, known_macs={sys.argv[2]: 'ens2'})\n"
      "state = network_state.parse_net_config_data(config)\n"
      "print(eni.Renderer({})._render_interfaces(state))\n";
  std::ofstream(dir.path() + "/render.py") << script;
  auto rendered = run_command({"env", "PYTHONPATH=" + cloud_init_python_path(), "/usr/bin/python3",
                               dir.path() + "/render.py", dir.path() + "/network_data.json", mac},
                              dir.path());
  INFO(rendered.err);
  REQUIRE(rendered.exit_code == 0);
  return rendered.out;
}

// The Debian image, built once and kept in /var/cache/toyvm, whose directories QEMU's user
// can traverse; returns the image dir that holds it as "debian-12".
std::string debian_image_dir() {
  static std::once_flag once;
  static const std::string dir = "/var/cache/toyvm";
  std::call_once(once, [] {
    std::string command = std::string(TOYVM_SOURCE_ROOT) + "/contrib/debian-image.sh " + dir + "/debian-12 >/dev/null";
    if (std::system(command.c_str()) != 0) throw std::runtime_error("contrib/debian-image.sh failed");
  });
  return dir;
}

// The guest's sshd takes connections (a refused connect costs far less than an ssh attempt).
bool accepts_ssh(const std::string& address) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(22);
  inet_pton(AF_INET, address.c_str(), &to.sin_addr);
  timeval limit{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0;
  close(fd);
  return connected;
}

struct Ssh {
  std::string key;   // private key file
  std::string pub;   // its public half

  explicit Ssh(const std::string& dir) : key(dir + "/id_ed25519"), pub(dir + "/id_ed25519.pub") {
    auto made = run_command({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "toyvm-test", "-f", key}, dir);
    if (made.exit_code != 0) throw std::runtime_error("ssh-keygen failed: " + made.err);
  }

  CommandResult run(const std::string& address, const std::string& command, const std::string& dir,
                    double timeout_s = 60) const {
    return run_command({"ssh", "-i", key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
                        "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
                        "debian@" + address, command},
                       dir, timeout_s);
  }
};

struct DebianHost {
  Servers servers;
  std::string rp;
  std::unique_ptr<Process> compute;

  // `serve_metadata`: the agent serves 169.254.169.254 on virbr0; without it, guests can
  // reach no metadata service at all.
  explicit DebianHost(bool serve_metadata) {
    ensure_libvirtd();
    std::string toml = "domain_type = 'qemu'\n"
                       "image_dir = '" + debian_image_dir() + "'\n"
                       "network = 'default'\n"
                       "address_timeout = 600\n";
    if (serve_metadata) toml += "metadata_interface = 'virbr0'\n[mdserver]\nlisten = ['169.254.169.254:80']\n";
    compute = servers.start_compute("c1", "VCPU:4,MEMORY_MB:4096,DISK_GB:40", &rp,
                                    {"--libvirt-uri", "qemu:///system"}, toml);
  }
};

// Boots the image with a new key and user data, then checks from inside the guest what
// cloud-init did with what toyvm told it; destroys it and requires audit clean.
void boot_and_check(DebianHost& host, std::vector<std::string> extra, const std::string& datasource) {
  const std::string dir = host.servers.dir();
  Ssh ssh(dir);
  const std::string user_data = dir + "/user-data.yaml";
  std::ofstream(user_data) << "#cloud-config\n"
                              "write_files:\n"
                              "  - path: /var/tmp/written-by-user-data\n"
                              "    content: \"file-marker-5d1e\\n\"\n"
                              "runcmd:\n"
                              "  - [sh, -c, 'echo runcmd-marker-a41c > /var/tmp/runcmd-ran']\n";
  std::vector<std::string> argv{"schedule", flavor, "--image", "debian-12", "--name", "vm1",
                                "--key-file", ssh.pub, "--user-data", user_data,
                                "--wait", "--timeout", std::to_string(int(boot_timeout_s))};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto scheduled = host.servers.toyvm(argv, boot_timeout_s + 30);
  INFO(scheduled.out << scheduled.err);
  REQUIRE(scheduled.exit_code == 0);
  const std::string uuid = parse_notified(scheduled.out).second;
  REQUIRE(!uuid.empty());
  auto record = wait_for_record(host.servers, uuid, [](const InstanceRecord& r) { return !r.ip.empty(); });
  REQUIRE(record);
  const std::string ip = record->ip;

  // ssh answers once the guest is up; cloud-init's status then waits for its last stage.
  CommandResult status;
  bool up = wait_for([&] {
    if (!accepts_ssh(ip)) return false;
    status = ssh.run(ip, "cloud-init status --wait", dir, 300);
    return status.exit_code == 0 || status.out.find("status:") != std::string::npos;
  }, boot_timeout_s);
  INFO("cloud-init status: " << status.out << status.err << "\nconsole:\n"
                             << host.servers.toyvm({"show", uuid, "--console"}).out);
  REQUIRE(up);
  CHECK_THAT(status.out, Catch::Contains("status: done"));

  auto in_guest = [&](const std::string& command) {
    auto ran = ssh.run(ip, command, dir);
    INFO(command << ": " << ran.err);
    CHECK(ran.exit_code == 0);
    return ran.out;
  };
  CHECK(in_guest("cat /var/lib/cloud/data/instance-id") == uuid + "\n");
  CHECK(in_guest("hostname") == "vm1\n");
  CHECK(in_guest("id -un") == "debian\n");  // the key logged in as the distro's default user
  CHECK(in_guest("cat /var/tmp/written-by-user-data") == "file-marker-5d1e\n");
  CHECK(in_guest("cat /var/tmp/runcmd-ran") == "runcmd-marker-a41c\n");
  // The NIC cloud-init configured holds the address toyvm reports, and keeps it.
  CHECK_THAT(in_guest("ip -4 -o addr show scope global"), Catch::Contains("inet " + ip + "/"));
  CHECK_THAT(in_guest("cat /run/cloud-init/status.json"), Catch::Contains(datasource));

  auto destroyed = host.servers.toyvm({"destroy", uuid, "--timeout", "120"}, 150);
  INFO(destroyed.err);
  CHECK(destroyed.exit_code == 0);
  auto audit = host.servers.toyvm({"audit"});
  INFO(audit.out << audit.err);
  CHECK(audit.exit_code == 0);
}

}  // namespace

TEST_CASE("cloud-init's own converter makes the network data DHCP on the guest's NIC", "[distro]") {
  GuestView guest;
  guest.uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";
  guest.hostname = "vm1";
  guest.mac = "52:54:00:12:34:56";
  guest.dns_servers = {"192.168.122.1"};
  MetadataResponse served = route_metadata("GET", "/openstack/latest/network_data.json", &guest);
  REQUIRE(served.status == 200);
  std::string rendered = cloud_init_renders(served.body, guest.mac);
  CHECK_THAT(rendered, Catch::Contains("auto ens2\niface ens2 inet dhcp"));
  CHECK_THAT(rendered, Catch::Contains("dns-nameservers 192.168.122.1"));

  // The config drive carries the same file.
  bool found = false;
  for (const DriveFile& file : config_drive_files(guest))
    if (file.path == "openstack/latest/network_data.json") found = file.content == served.body;
  CHECK(found);
}

TEST_CASE("a Debian cloud guest configures itself from toyvm's metadata service", "[distro]") {
  DebianHost host(true);
  boot_and_check(host, {}, "DataSourceOpenStackLocal");
}

TEST_CASE("a Debian cloud guest that reaches no metadata service configures itself from its config drive",
          "[distro]") {
  DebianHost host(false);
  boot_and_check(host, {"--config-drive"}, "DataSourceConfigDrive");
}
