// Images, power and consoles against real etcd and Placement, with libvirt's test driver in
// the agent: everything but booting a guest (tests/integration/test_guests.cpp does that).

#include "harness.hpp"
#include "core/sha256.hpp"
#include "model/keys.hpp"
#include "model/records.hpp"

#include "catch_result.hpp"

#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace toyvm;
using namespace toyvm::test;
namespace fs = std::filesystem;

namespace {

const std::string small = "resources=VCPU:1,DISK_GB:1,MEMORY_MB:256";
const std::string inventory = "VCPU:8,DISK_GB:100,MEMORY_MB:4096";

void write_file(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

std::string random_bytes(size_t n) {
  std::string bytes(n, '\0');
  std::ifstream("/dev/urandom", std::ios::binary).read(bytes.data(), std::streamsize(n));
  return bytes;
}

// A fake kernel that passes the bzImage check; the test driver never runs it.
std::string fake_kernel() {
  std::string kernel(4096, '\0');
  kernel.replace(0x202, 4, "HdrS");
  return kernel;
}

struct ImageHost {
  Servers servers;
  std::string rp;
  std::string images;
  std::unique_ptr<Process> compute;

  explicit ImageHost(const std::string& extra_toml = "") {
    images = servers.dir() + "/images";
    fs::create_directories(images);
    compute = servers.start_compute("c1", inventory, &rp, {},
                                    "image_dir = '" + images + "'\nstop_timeout = 5\n" + extra_toml);
  }

  // Schedules and waits; returns the uuid and the final record.
  std::pair<std::string, InstanceRecord> schedule(std::vector<std::string> args, int expected_exit) {
    std::vector<std::string> argv{"schedule", small, "--wait", "--timeout", "60"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto scheduled = servers.toyvm(argv, 90);
    INFO(scheduled.out << scheduled.err);
    CHECK(scheduled.exit_code == expected_exit);
    auto [target, uuid] = parse_notified(scheduled.out);
    REQUIRE(!uuid.empty());
    auto record = wait_for_record(servers, uuid, [](const InstanceRecord&) { return true; });
    REQUIRE(record);
    return {uuid, *record};
  }

  // ERROR image_failure with nothing held in Placement and no domain left.
  void expect_image_failure(std::vector<std::string> args, const std::string& message) {
    int64_t vcpus_before = servers.usages(rp)["VCPU"];
    auto [uuid, record] = schedule(std::move(args), 5);
    CHECK(record.state == InstanceState::error);
    CHECK(record.error_code == "image_failure");
    CHECK_THAT(record.error_message, Catch::Contains(message));
    CHECK(servers.allocations(uuid).empty());
    CHECK(servers.usages(rp)["VCPU"] == vcpus_before);
    CHECK_FALSE(fs::exists(servers.dir() + "/c1/instances/" + uuid));
  }
};

}  // namespace

TEST_CASE("a missing or corrupt image is ERROR image_failure and holds nothing", "[images]") {
  ImageHost host;
  host.expect_image_failure({"--image", "nothere.qcow2"}, "not found");
  write_file(host.images + "/broken.qcow2", std::string("QFI\xfb\0\0\0\x09", 8) + random_bytes(200));
  host.expect_image_failure({"--image", "broken.qcow2"}, "qcow2 version");
  write_file(host.images + "/empty.raw", "");
  host.expect_image_failure({"--image", "empty.raw"}, "empty");
  fs::create_directories(host.images + "/notakernel");
  write_file(host.images + "/notakernel/kernel", random_bytes(4096));
  host.expect_image_failure({"--image", "notakernel"}, "not a Linux kernel");
  write_file(host.images + "/disk.raw", random_bytes(4096));
  host.expect_image_failure({"--image", "disk.raw", "--image-sha256", std::string(64, '0')}, "expected 000");
  // A qcow2 whose data lives in another file (qemu-img writes the header's name of it, and
  // truncates that file: a scratch one here).
  std::string made = "qemu-img create -q -f qcow2 -o data_file=" + host.servers.dir() + "/scratch.data " + host.images +
                     "/external.qcow2 1M";
  REQUIRE(std::system(made.c_str()) == 0);
  host.expect_image_failure({"--image", "external.qcow2"}, "external data file");
}

// A raw disk is the guest's to write, first sector included: a guest can make its own disk
// look like a qcow2 whose backing file is any host file. Its format is never guessed.
TEST_CASE("a raw image is never taken for qcow2: the format comes from the reference", "[images]") {
  ImageHost host;
  std::string secret = host.servers.dir() + "/secret";
  write_file(secret, "host secret");
  // A qcow2 header naming a backing file, as a guest could write into its raw disk.
  std::string made = "qemu-img create -q -f qcow2 -F raw -b " + secret + " " + host.servers.dir() + "/posing 1M";
  REQUIRE(std::system(made.c_str()) == 0);
  std::string posing = read_file(host.servers.dir() + "/posing");
  write_file(host.images + "/posing.raw", posing);
  write_file(host.images + "/posing", posing);

  auto [raw, record] = host.schedule({"--image", "posing.raw"}, 0);
  CHECK(record.state == InstanceState::active);  // a raw disk, whatever its first bytes say
  host.expect_image_failure({"--image", "posing"}, "does not say its format");
  auto [declared, declared_record] = host.schedule({"--image", "posing", "--image-format", "raw"}, 0);
  CHECK(declared_record.state == InstanceState::active);
  host.expect_image_failure({"--image", "posing", "--image-format", "qcow2"}, "backing file");
  // A real qcow2 under a name that does not say so goes with --image-format.
  REQUIRE(std::system(("qemu-img create -q -f qcow2 " + host.images + "/plain 1M").c_str()) == 0);
  host.expect_image_failure({"--image", "plain"}, "does not say its format");
  auto [plain, plain_record] = host.schedule({"--image", "plain", "--image-format", "qcow2"}, 0);
  CHECK(plain_record.state == InstanceState::active);
  CHECK(host.servers.toyvm({"schedule", small, "--image", "plain", "--image-format", "vmdk"}).exit_code == 2);
}

TEST_CASE("image references cannot leave the image directory", "[images]") {
  ImageHost host("image_schemes = ['file', 'http']");
  std::string secret = host.servers.dir() + "/secret.raw";
  write_file(secret, random_bytes(4096));
  fs::create_symlink(secret, host.images + "/escape.raw");
  fs::create_directories(host.images + "/kernel-escape");
  fs::create_symlink(secret, host.images + "/kernel-escape/kernel");

  host.expect_image_failure({"--image", "escape.raw"}, "outside the image directory");
  host.expect_image_failure({"--image", "kernel-escape"}, "outside the image directory");
  host.expect_image_failure({"--image", "file://" + secret}, "outside the image directory");
  host.expect_image_failure({"--image", "https://127.0.0.1:1/x.qcow2"}, "'https' is not allowed");

  // Refused before anything is claimed.
  size_t instances = host.servers.etcd_prefix(KeyLayout().instances_prefix()).size();
  for (std::string bad : {std::string("../secret.raw"), "file://" + host.images + "/../secret.raw"}) {
    auto refused = host.servers.toyvm({"schedule", small, "--image", bad});
    CHECK(refused.exit_code == 2);
    CHECK(host.servers.etcd_prefix(KeyLayout().instances_prefix()).size() == instances);
  }
}

TEST_CASE("names, file URLs and kernel-boot directories resolve in the image directory", "[images]") {
  ImageHost host;
  write_file(host.images + "/disk.raw", random_bytes(1 << 16));
  fs::create_directories(host.images + "/tiny");
  write_file(host.images + "/tiny/kernel", fake_kernel());
  write_file(host.images + "/tiny/initrd", random_bytes(1024));
  write_file(host.images + "/tiny/cmdline", "console=ttyS0\n");
  std::string digest = sha256_hex(read_file(host.images + "/disk.raw"));

  for (std::vector<std::string> image : {std::vector<std::string>{"--image", "disk.raw", "--image-sha256", digest},
                                         std::vector<std::string>{"--image", "file://" + host.images + "/disk.raw"},
                                         std::vector<std::string>{"--image", "tiny"}}) {
    auto [uuid, record] = host.schedule(image, 0);
    CHECK(record.state == InstanceState::active);
    CHECK_FALSE(record.mac.empty());
    CHECK(host.servers.toyvm({"destroy", uuid}).exit_code == 0);
  }
}

TEST_CASE("an http image is fetched once for concurrent builds and checked against its sha256", "[images]") {
  ImageHost host;
  TempDir served;
  std::string image = random_bytes(3 << 20);
  write_file(served.path() + "/base.raw", image);
  FileServer http(served.path(), host.servers.dir() + "/http.log");

  auto scheduled = host.servers.toyvm({"schedule", small, "--count", "3", "--image", http.url("base.raw"),
                                       "--image-sha256", sha256_hex(image), "--wait", "--timeout", "60"},
                                      90);
  INFO(scheduled.out << scheduled.err);
  REQUIRE(scheduled.exit_code == 0);
  auto records = host.servers.etcd_prefix(KeyLayout().instances_prefix());
  REQUIRE(records.size() == 3);
  for (const KeyValue& kv : records) CHECK(decode_instance(kv.value)->state == InstanceState::active);
  CHECK(http.requests_for("base.raw") == 1);

  int cached = 0;
  for (const auto& entry : fs::directory_iterator(host.servers.dir() + "/c1/image-cache")) {
    if (entry.path().extension() != ".img") continue;
    ++cached;
    CHECK(read_file(entry.path()) == image);
  }
  CHECK(cached == 1);

  // From the cache now; a digest that does not match is refused even so.
  auto [uuid, record] = host.schedule({"--image", http.url("base.raw")}, 0);
  CHECK(record.state == InstanceState::active);
  CHECK(http.requests_for("base.raw") == 1);
  host.expect_image_failure({"--image", http.url("base.raw"), "--image-sha256", std::string(64, 'a')},
                            "expected aaaa");
  host.expect_image_failure({"--image", http.url("missing.raw")}, "HTTP 404");
}

TEST_CASE("destroy while the image is being fetched cancels the build and leaves nothing", "[images]") {
  ImageHost host;
  StallingServer stalling(host.servers.dir() + "/stall.log");
  auto scheduled = host.servers.toyvm({"schedule", small, "--image", stalling.url()});
  REQUIRE(scheduled.exit_code == 0);
  auto [target, uuid] = parse_notified(scheduled.out);
  REQUIRE(wait_for_record(host.servers, uuid,
                          [](const InstanceRecord& r) { return r.state == InstanceState::building; }));

  auto destroyed = host.servers.toyvm({"destroy", uuid, "--timeout", "20"});
  INFO(destroyed.err);
  CHECK(destroyed.exit_code == 0);
  CHECK(host.servers.allocations(uuid).empty());
  CHECK(host.servers.usages(host.rp)["VCPU"] == 0);
  CHECK(host.servers.etcd_prefix(KeyLayout().work(host.rp, uuid)).empty());
  CHECK_FALSE(fs::exists(host.servers.dir() + "/c1/instances/" + uuid));
  auto hosts = host.servers.etcd_prefix(KeyLayout().host(host.rp));
  REQUIRE(hosts.size() == 1);
  CHECK(wait_for([&] { return published_domains(host.servers, host.rp) == 0; }, 10));
}

TEST_CASE("stop and start change the power state and keep the domain", "[images]") {
  ImageHost host;
  auto [uuid, record] = host.schedule({}, 0);
  REQUIRE(record.state == InstanceState::active);

  auto stopped = host.servers.toyvm({"stop", uuid});
  INFO(stopped.err);
  CHECK(stopped.exit_code == 0);
  CHECK_THAT(stopped.out, Catch::Contains("STOPPED INSTANCE " + uuid));
  CHECK_THAT(host.servers.toyvm({"show", uuid}).out, Catch::Contains("STOPPED"));
  CHECK(host.servers.usages(host.rp)["VCPU"] == 1);  // a stopped instance keeps its allocation

  auto started = host.servers.toyvm({"start", uuid});
  CHECK(started.exit_code == 0);
  CHECK_THAT(started.out, Catch::Contains("STARTED INSTANCE " + uuid));
  CHECK_THAT(host.servers.toyvm({"show", uuid}).out, Catch::Contains("ACTIVE"));

  CHECK(host.servers.toyvm({"stop", "5b0fdbc8-5d2c-4a57-9d0b-4a3f3c2ad1c4"}).exit_code == 3);
  CHECK(host.servers.toyvm({"start", "not-a-uuid"}).exit_code == 2);
}

TEST_CASE("a config drive is made for the instance that asks, or for all, and goes with it", "[images]") {
  auto drive_of = [](const ImageHost& host, const std::string& uuid) {
    return host.servers.dir() + "/c1/instances/" + uuid + "/config-drive.iso";
  };
  {
    ImageHost host;
    std::string user_data = host.servers.dir() + "/user-data";
    write_file(user_data, "#cloud-config\nruncmd: [echo drive-marker-1c9e]\n");
    auto [with, record] = host.schedule({"--config-drive", "--user-data", user_data, "--name", "drive-one"}, 0);
    REQUIRE(record.state == InstanceState::active);
    auto [without, other] = host.schedule({}, 0);
    REQUIRE(other.state == InstanceState::active);

    const std::string drive = drive_of(host, with);
    REQUIRE(fs::exists(drive));
    CHECK((fs::status(drive).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));
    std::string bytes = read_file(drive);
    CHECK(bytes.find("drive-marker-1c9e") != std::string::npos);  // the user data
    CHECK(bytes.find(with) != std::string::npos);                 // the instance-id
    CHECK_FALSE(fs::exists(drive_of(host, without)));

    REQUIRE(host.servers.toyvm({"destroy", with}).exit_code == 0);
    CHECK_FALSE(fs::exists(drive));  // it holds secrets: gone with the instance
  }
  {
    ImageHost forced("config_drive = true");  // Nova's force_config_drive
    auto [uuid, record] = forced.schedule({}, 0);
    REQUIRE(record.state == InstanceState::active);
    CHECK(fs::exists(drive_of(forced, uuid)));
  }
}

TEST_CASE("show --console prints the tail the agent published", "[images]") {
  ImageHost host("console_interval = 0.2");
  auto [uuid, record] = host.schedule({}, 0);
  auto none = host.servers.toyvm({"show", uuid, "--console"});
  CHECK(none.exit_code == 0);
  CHECK_THAT(none.err, Catch::Contains("no console output yet"));

  // The test driver writes no console: stand in for QEMU.
  std::string log = host.servers.dir() + "/c1/instances/" + uuid + "/console.log";
  // A guest's escape sequence (retitle the terminal, clear the screen) reaches the operator
  // defused, unless asked for raw.
  write_file(log, std::string(20000, '.') + "\r\n\x1b]0;owned\x07\x1b[2Jlogin: ");
  CHECK(wait_for([&] { return host.servers.toyvm({"show", uuid, "--console"}).out.find("login:") != std::string::npos; },
                 10));
  std::string tail = host.servers.toyvm({"show", uuid, "--console"}).out;
  CHECK(tail.size() <= 16 * 1024 + 16);
  CHECK(tail.find('\x1b') == std::string::npos);
  CHECK(tail.find('\r') == std::string::npos);
  CHECK_THAT(tail, Catch::EndsWith("\n^[]0;owned^G^[[2Jlogin: \n"));
  std::string raw = host.servers.toyvm({"show", uuid, "--console", "--raw"}).out;
  CHECK_THAT(raw, Catch::EndsWith("\r\n\x1b]0;owned\x07\x1b[2Jlogin: \n"));

  // Read and gone: nobody asks, so a console that keeps growing costs etcd nothing.
  CHECK(host.servers.etcd_prefix(KeyLayout().console_prefix("default", uuid)).empty());
  write_file(log, std::string(20000, '.') + "\r\nlogin: root\r\n# ");
  CHECK_FALSE(wait_for([&] { return !host.servers.etcd_prefix(KeyLayout().console_prefix("default", uuid)).empty(); }, 2));

  // --follow prints what the guest writes next, once.
  auto follow = host.servers.spawn_toyvm({"show", uuid, "--console", "--follow"}, "follow.log");
  CHECK(wait_for([&] { return follow->output().find("login: root") != std::string::npos; }, 10));
  write_file(log, std::string(20000, '.') + "\r\nlogin: root\r\n# uptime\r\n 12:00 up 1 min\r\n# ");
  CHECK(wait_for([&] { return follow->output().find("up 1 min") != std::string::npos; }, 10));
  // etcd going away meanwhile, for longer than the request lease's TTL, is waited out.
  host.servers.stop_etcd();
  CHECK_FALSE(wait_for([&] { return !follow->running(); }, 12));
  host.servers.start_etcd_again();
  write_file(log, std::string(20000, '.') + "\r\nlogin: root\r\n# uptime\r\n 12:00 up 1 min\r\n# date\r\nafter etcd\r\n# ");
  CHECK(wait_for([&] { return follow->output().find("after etcd") != std::string::npos; }, 30));
  follow->signal(SIGINT);
  follow->wait();
  std::string followed = follow->output();
  CHECK(followed.find("login: root") == followed.rfind("login: root"));
  // Its request and the console go with its lease.
  CHECK(wait_for([&] { return host.servers.etcd_prefix(KeyLayout().console_prefix("default", uuid)).empty(); }, 20));

  // Two followers at once: the second one leaving does not end the first one's.
  auto first = host.servers.spawn_toyvm({"show", uuid, "--console", "--follow"}, "follow-1.log");
  auto second = host.servers.spawn_toyvm({"show", uuid, "--console", "--follow"}, "follow-2.log");
  CHECK(wait_for([&] { return second->output().find("after etcd") != std::string::npos &&
                              first->output().find("after etcd") != std::string::npos; }, 10));
  second->signal(SIGINT);
  second->wait();
  write_file(log, std::string(20000, '.') + "\r\n# date\r\nafter etcd\r\n# echo still\r\nstill followed\r\n# ");
  CHECK(wait_for([&] { return first->output().find("still followed") != std::string::npos; }, 10));
  first->signal(SIGINT);
  first->wait();

  CHECK(host.servers.toyvm({"destroy", uuid}).exit_code == 0);
  CHECK(host.servers.etcd_prefix(KeyLayout().console_prefix("default", uuid)).empty());
}

TEST_CASE("show --console says so when the instance's host does not answer", "[images]") {
  ImageHost host("console_interval = 0.2");
  auto [uuid, record] = host.schedule({}, 0);
  host.compute->signal(SIGKILL);
  host.compute->wait();
  auto silent = host.servers.toyvm({"show", uuid, "--console", "--timeout", "1"});
  CHECK(silent.exit_code == 5);
  CHECK(count_lines(silent.err) == 1);
  CHECK_THAT(silent.err, Catch::Contains("did not publish its console within 1 s"));
}

TEST_CASE("an https image is fetched with the configured CA and refused under another", "[images]") {
  TempDir served;
  std::string pki = served.path() + "/pki";
  make_certificates(pki);
  std::string image = random_bytes(1 << 20);
  write_file(served.path() + "/base.raw", image);

  ImageHost trusting("image_ca_file = '" + pki + "/ca.crt'");
  FileServer https(served.path(), trusting.servers.dir() + "/https.log", pki);
  auto [uuid, record] = trusting.schedule({"--image", https.url("base.raw"), "--image-sha256", sha256_hex(image)}, 0);
  CHECK(record.state == InstanceState::active);
  CHECK(https.requests_for("base.raw") == 1);

  ImageHost distrusting("image_ca_file = '" + pki + "/other-ca.crt'");
  distrusting.expect_image_failure({"--image", https.url("base.raw")}, "certificate verify failed");
}
