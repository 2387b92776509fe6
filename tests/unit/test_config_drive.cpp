#include "virt/backend.hpp"
#include "virt/config_drive.hpp"

#include "catch_result.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

using namespace toyvm;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// What blkid (util-linux), as cloud-init runs it, says of the volume.
std::string blkid(const std::string& path) {
  std::string command = "blkid -p -o export '" + path + "'";
  std::string out;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, pipe)) out += buf;
    pclose(pipe);
  }
  return out;
}

}  // namespace

TEST_CASE("a config drive is an ISO 9660 volume labelled config-2, its owner's only") {
  fs::path dir = fs::temp_directory_path() / ("toyvm-drive-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "config-drive.iso").string();
  std::string user_data = "#cloud-config\nruncmd: [echo marker-7f3a]\n";
  std::vector<DriveFile> files{{"openstack/latest/meta_data.json", R"({"uuid":"u-1"})"},
                               {"openstack/latest/user_data", user_data},
                               {"ec2/latest/meta-data.json", "{}"}};
  REQUIRE(write_config_drive(path, files));

  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(st.st_size % 2048 == 0);
  std::string found = blkid(path);
  CHECK_THAT(found, Catch::Contains("TYPE=iso9660"));
  CHECK_THAT(found, Catch::Contains("LABEL=config-2"));
  std::string bytes = slurp(path);
  CHECK(bytes.find(user_data) != std::string::npos);
  CHECK(bytes.find("meta_data.json") != std::string::npos);  // Rock Ridge keeps the name as it is
  CHECK_FALSE(fs::exists(path + ".partial"));

  // Made again (the instance rebuilt here): replaced, never appended to.
  files.pop_back();
  REQUIRE(write_config_drive(path, files));
  CHECK(slurp(path).find("meta-data.json") == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("a drive that cannot be written is a clear failure, leaving nothing") {
  auto written = write_config_drive("/nonexistent-dir/config-drive.iso", {{"a/b", "c"}});
  REQUIRE_FALSE(written);
  CHECK(written.error() == errc::launch_failure);
  CHECK_THAT(written.error().message(), Catch::Contains("/nonexistent-dir/config-drive.iso"));
}

TEST_CASE("a libvirt network's DNS is its IPv4 address, unless its DNS is off") {
  const std::string nat =
      "<network><name>default</name><forward mode='nat'/><bridge name='virbr0'/>"
      "<ip address='192.168.122.1' netmask='255.255.255.0'><dhcp><range start='192.168.122.2' end='192.168.122.254'/>"
      "</dhcp></ip><ip family='ipv6' address='fd00::1' prefix='64'/></network>";
  CHECK(network_dns_addresses(nat) == std::vector<std::string>{"192.168.122.1"});
  CHECK(network_dns_addresses("<network><dns enable='no'/><ip address='10.0.0.1'/></network>").empty());
  CHECK(network_dns_addresses("<network><forward mode='bridge'/><bridge name='br0'/></network>").empty());
  CHECK(network_dns_addresses("<network><ip address='10.0.0.1'").empty());  // cut short: nothing taken
}

#include "virt/host_network.hpp"

TEST_CASE("a guest's addresses are read from the host's neighbour table, complete entries only") {
  const std::string table =
      "IP address       HW type     Flags       HW address            Mask     Device\n"
      "192.168.122.250  0x1         0x2         52:54:00:ee:e4:8b     *        virbr0\n"
      "192.168.122.64   0x1         0x0         52:54:00:ee:e4:8b     *        virbr0\n"
      "10.0.0.7         0x1         0x2         52:54:00:00:00:01     *        br0\n"
      "garbage\n"
      "192.168.122.251  0x1         0x6         52:54:00:EE:E4:8B     *        virbr0";
  CHECK(arp_addresses(table, "52:54:00:ee:e4:8b") == std::vector<std::string>{"192.168.122.250", "192.168.122.251"});
  CHECK(arp_addresses(table, "52:54:00:00:00:02").empty());
  CHECK(arp_addresses("", "52:54:00:ee:e4:8b").empty());
}
