#include "core/base64.hpp"
#include "model/metadata.hpp"

#include "catch_result.hpp"

#include <simdjson.h>

#include <map>

using namespace toyvm;

namespace {

GuestView guest() {
  GuestView g;
  g.uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";
  g.name = "web 1";
  g.hostname = "web-1";
  g.ip = "192.168.122.10";
  g.user_data = "#cloud-config\nruncmd: [true]\n";
  g.public_keys = {{"alice", "ssh-ed25519 AAAA alice"}, {"bob", "ssh-rsa BBBB bob"}};
  return g;
}

std::string get(std::string_view path, const GuestView* g, int expect_status = 200) {
  MetadataResponse r = route_metadata("GET", path, g);
  INFO(path);
  CHECK(r.status == expect_status);
  return r.body;
}

}  // namespace

TEST_CASE("EC2 meta-data paths answer for the asking guest") {
  GuestView g = guest();
  for (std::string version : {"latest", "2009-04-04", "2021-03-23"}) {
    std::string base = "/" + version;
    CHECK(get(base + "/meta-data/instance-id", &g) == g.uuid);
    CHECK(get(base + "/meta-data/hostname", &g) == "web-1");
    CHECK(get(base + "/meta-data/local-hostname", &g) == "web-1");
    CHECK(get(base + "/meta-data/local-ipv4", &g) == "192.168.122.10");
    CHECK(get(base + "/meta-data/public-keys/", &g) == "0=alice\n1=bob");
    CHECK(get(base + "/meta-data/public-keys/1/", &g) == "openssh-key");
    CHECK(get(base + "/meta-data/public-keys/1/openssh-key", &g) == "ssh-rsa BBBB bob\n");
    CHECK(get(base + "/user-data", &g) == g.user_data);
    CHECK_THAT(get(base + "/meta-data/", &g), Catch::Contains("public-keys/"));
    CHECK_THAT(get(base + "/meta-data", &g), Catch::Contains("instance-id"));
    CHECK(get(base + "/", &g) == "meta-data/\nuser-data");
  }
  CHECK_THAT(get("/", &g), Catch::Contains("2009-04-04\n"));
  CHECK_THAT(get("/", &g), Catch::EndsWith("latest"));
  CHECK(get("/latest/meta-data/placement/availability-zone", &g) == "nova");
}

TEST_CASE("OpenStack paths answer as cloud-init parses them") {
  GuestView g = guest();
  CHECK_THAT(get("/openstack", &g), Catch::Contains("2012-08-10"));
  CHECK_THAT(get("/openstack/", &g), Catch::EndsWith("latest"));
  CHECK_THAT(get("/openstack/latest/", &g), Catch::Contains("meta_data.json"));
  CHECK(get("/openstack/latest/user_data", &g) == g.user_data);
  CHECK(get("/openstack/2018-08-27/vendor_data.json", &g) == "{}");
  CHECK_THAT(get("/openstack/latest/network_data.json", &g), Catch::Contains("\"networks\""));

  MetadataResponse meta = route_metadata("GET", "/openstack/latest/meta_data.json", &g);
  REQUIRE(meta.status == 200);
  CHECK(meta.content_type == "application/json");
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(meta.body);
  CHECK(std::string_view(doc["uuid"]) == g.uuid);
  CHECK(std::string_view(doc["name"]) == "web 1");
  CHECK(std::string_view(doc["hostname"]) == "web-1");
  CHECK(std::string_view(doc["public_keys"]["alice"]) == "ssh-ed25519 AAAA alice");
  CHECK(int64_t(doc["launch_index"]) == 0);
  CHECK(std::string_view(doc["availability_zone"]) == "nova");
}

TEST_CASE("network data describes the guest's NIC as Nova does: a link by MAC, DHCP on it, the network's DNS") {
  GuestView g = guest();
  g.mac = "52:54:00:ab:cd:ef";
  g.dns_servers = {"192.168.122.1"};
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(get("/openstack/latest/network_data.json", &g));
  simdjson::dom::array links = doc["links"];
  REQUIRE(links.size() == 1);
  simdjson::dom::element link = links.at(0);
  CHECK(std::string_view(link["ethernet_mac_address"]) == "52:54:00:ab:cd:ef");
  CHECK(std::string_view(link["type"]) == "phy");
  simdjson::dom::array networks = doc["networks"];
  REQUIRE(networks.size() == 1);
  CHECK(std::string_view(networks.at(0)["type"]) == "ipv4_dhcp");
  CHECK(std::string_view(networks.at(0)["link"]) == std::string_view(link["id"]));
  simdjson::dom::array services = doc["services"];
  REQUIRE(services.size() == 1);
  CHECK(std::string_view(services.at(0)["type"]) == "dns");
  CHECK(std::string_view(services.at(0)["address"]) == "192.168.122.1");

  // No NIC: nothing to configure, and nothing made up.
  g.mac.clear();
  doc = parser.parse(get("/openstack/latest/network_data.json", &g));
  CHECK(simdjson::dom::array(doc["links"]).size() == 0);
  CHECK(simdjson::dom::array(doc["networks"]).size() == 0);
  CHECK(simdjson::dom::array(doc["services"]).size() == 0);
}

TEST_CASE("a config drive holds what the metadata service answers, in Nova's layout") {
  GuestView g = guest();
  g.mac = "52:54:00:ab:cd:ef";
  g.ip.clear();  // not known when the drive is made
  std::map<std::string, std::string> files;
  for (const DriveFile& file : config_drive_files(g)) CHECK(files.emplace(file.path, file.content).second);
  CHECK(files.at("openstack/latest/meta_data.json") == get("/openstack/latest/meta_data.json", &g));
  CHECK(files.at("openstack/latest/network_data.json") == get("/openstack/latest/network_data.json", &g));
  CHECK(files.at("openstack/latest/user_data") == g.user_data);
  CHECK(files.at("openstack/latest/vendor_data.json") == "{}");
  CHECK(files.at("ec2/latest/user-data") == g.user_data);
  simdjson::dom::parser parser;
  simdjson::dom::element ec2 = parser.parse(files.at("ec2/latest/meta-data.json"));
  CHECK(std::string_view(ec2["instance-id"]) == g.uuid);
  CHECK(std::string_view(ec2["public-keys"]["1"]["openssh-key"]) == "ssh-rsa BBBB bob\n");
  CHECK(ec2["local-ipv4"].error() == simdjson::NO_SUCH_FIELD);

  g.user_data.clear();
  for (const DriveFile& file : config_drive_files(g)) CHECK_THAT(file.path, !Catch::Contains("user"));
}

TEST_CASE("a guest without user data gets 404 for it, and no listing of it") {
  GuestView g = guest();
  g.user_data.clear();
  get("/latest/user-data", &g, 404);
  get("/openstack/latest/user_data", &g, 404);
  CHECK(get("/latest/", &g) == "meta-data/");
  CHECK_THAT(get("/openstack/latest/", &g), !Catch::Contains("user_data"));
}

TEST_CASE("unknown guests, paths and methods are refused") {
  GuestView g = guest();
  get("/latest/meta-data/instance-id", nullptr, 404);
  get("/", nullptr, 404);
  get("/openstack/latest/meta_data.json", nullptr, 404);
  get("/latest/meta-data/nothing", &g, 404);
  get("/2008-02-01/meta-data/instance-id", &g, 404);
  get("/openstack/1999-01-01/meta_data.json", &g, 404);
  get("/latest/meta-data/public-keys/2/openssh-key", &g, 404);
  get("/latest/meta-data/public-keys/x/openssh-key", &g, 404);
  get("/latest/meta-data/instance-id/extra", &g, 404);
  get("/latest/../openstack/latest/meta_data.json", &g, 400);
  get("/latest//meta-data", &g, 400);
  get("latest/meta-data", &g, 400);
  CHECK(route_metadata("POST", "/latest/meta-data/", &g).status == 405);
  CHECK(route_metadata("DELETE", "/openstack/latest/meta_data.json", &g).status == 405);
  CHECK(route_metadata("HEAD", "/latest/meta-data/instance-id", &g).status == 200);
  CHECK(get("/latest/meta-data/instance-id?x=1", &g) == g.uuid);
}

TEST_CASE("hostnames are made safe") {
  CHECK(hostname_for("Web Server #1", "7387cdc8-x") == "web-server-1");
  CHECK(hostname_for("", "7387cdc8-291c") == "instance-7387cdc8");
  CHECK(hostname_for("***", "7387cdc8-291c") == "instance-7387cdc8");
  CHECK(hostname_for(std::string(100, 'a'), "u").size() == 63);
}

TEST_CASE("base64 round-trips every byte and refuses garbage") {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(char(i));
  for (size_t n : {0, 1, 2, 3, 4, 255, 256}) {
    std::string part = all.substr(0, n);
    CHECK(base64_decode(base64_encode(part)) == part);
  }
  CHECK(base64_encode("hi") == "aGk=");
  CHECK(base64_decode("aGk=") == "hi");
  CHECK_FALSE(base64_decode("abc"));
  CHECK_FALSE(base64_decode("ab!d"));
  CHECK_FALSE(base64_decode("a==="));
  CHECK_FALSE(base64_decode("aGk=aGk="));
  CHECK_FALSE(base64_decode(" aGk"));  // OpenSSL's decoder forgives spaces around the text
  CHECK_FALSE(base64_decode("aGk=\n\n\n\n"));
}

TEST_CASE("base64 refuses non-canonical padding bits") {
  CHECK_FALSE(base64_decode("++=="));  // found by fuzz_records
  CHECK(base64_decode("+w=="));
  CHECK_FALSE(base64_decode("aGl="));
  CHECK(base64_decode("aGk="));
}

#include "model/rate_limit.hpp"

TEST_CASE("each source gets its burst, then its rate; others are not affected") {
  using namespace std::chrono_literals;
  RateLimiter limiter(10, 5);  // 10/s, bursts of 5
  auto t0 = RateLimiter::Clock::time_point{} + 1h;
  for (int i = 0; i < 5; ++i) CHECK(limiter.allow("10.0.0.1", t0));
  CHECK_FALSE(limiter.allow("10.0.0.1", t0));
  CHECK(limiter.allow("10.0.0.2", t0));             // another guest is served
  CHECK_FALSE(limiter.allow("10.0.0.1", t0 + 50ms));  // half a token
  CHECK(limiter.allow("10.0.0.1", t0 + 100ms));       // one token back
  CHECK_FALSE(limiter.allow("10.0.0.1", t0 + 100ms));
  for (int i = 0; i < 5; ++i) CHECK(limiter.allow("10.0.0.1", t0 + 10s));  // refilled to the burst only
  CHECK_FALSE(limiter.allow("10.0.0.1", t0 + 10s));
  RateLimiter off(0, 0);
  for (int i = 0; i < 100; ++i) CHECK(off.allow("x", t0));
}
