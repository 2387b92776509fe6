#include "core/config.hpp"

#include "catch_result.hpp"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <sys/stat.h>

using namespace toyvm;

TEST_CASE("an empty file gives the documented defaults") {
  auto config = parse_config("");
  REQUIRE(config);
  CHECK(config->etcd.endpoints == std::vector<std::string>{"http://127.0.0.1:2379"});
  CHECK(config->placement.endpoint == "http://127.0.0.1:8080");
  CHECK(config->placement.token == "admin");
  CHECK(config->compute.policy.reserved_memory_mb == 512);
  CHECK(config->compute.policy.cpu_allocation_ratio == 4.0);
}

TEST_CASE("the packaged configuration file is the README's list, every key commented out at its default") {
  auto read = [](const char* path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string file = read(TOYVM_SOURCE_ROOT "/contrib/toyvm.toml");
  REQUIRE_FALSE(file.empty());
  // Its opening comment dropped and each key uncommented: the README's block, to the byte.
  std::istringstream lines(file);
  std::string line, keys;
  bool opened = false;
  while (std::getline(lines, line)) {
    opened = opened || line.starts_with("[");
    if (!opened) continue;
    if (line.size() > 1 && line[0] == '#' && line[1] >= 'a' && line[1] <= 'z') line.erase(0, 1);
    keys += line + "\n";
  }
  CHECK(read(TOYVM_SOURCE_ROOT "/README.md").find("```toml\n" + keys + "```") != std::string::npos);
  auto config = parse_config(keys);
  CHECK(config);
}

TEST_CASE("every section is read") {
  auto config = parse_config(R"(
[etcd]
endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
prefix = "/other"
[placement]
endpoint = "http://placement:8778"
token = "secret"
candidate_limit = 7
[compute]
state_dir = "/srv/toyvm"
libvirt_uri = "test:///default"
inventory = "VCPU:2"
traits = ["CUSTOM_A"]
cpu_allocation_ratio = 2
reserved_memory_mb = 0
[schedule]
image = "cirros"
)");
  REQUIRE(config);
  CHECK(config->etcd.endpoints.size() == 2);
  CHECK(config->etcd.prefix == "/other");
  CHECK(config->placement.candidate_limit == 7);
  CHECK(config->compute.traits == std::vector<std::string>{"CUSTOM_A"});
  CHECK(config->compute.policy.cpu_allocation_ratio == 2.0);
  CHECK(config->compute.policy.reserved_memory_mb == 0);
  CHECK(config->schedule.image == "cirros");
}

TEST_CASE("typos and wrong types are errors that say where") {
  struct Case {
    const char* toml;
    const char* mentions;
  };
  const Case cases[] = {
      {"[etcd]\nendpoint = \"x\"", "unknown key 'endpoint' in [etcd]"},
      {"[placment]\n", "unknown section [placment]"},
      {"[placement]\ncandidate_limit = \"many\"", "must be an integer"},
      {"[etcd]\nendpoints = \"http://x\"", "must be an array of strings"},
      {"[etcd\n", "line 1"},
      {"etcd = 3", "[etcd] must be a table"},
      {"[etcd]\nendpoints = []", "etcd.endpoints is empty"},
      {"[placement]\nprovider_trait = \"TOYVM\"", "placement.provider_trait must be CUSTOM_"},
      {"[placement]\nprovider_trait = \"CUSTOM_toyvm\"", "placement.provider_trait must be CUSTOM_"},
      {"[placement]\nprovider_trait = \"CUSTOM_\"", "placement.provider_trait must be CUSTOM_"},
  };
  for (const Case& c : cases) {
    INFO(c.toml);
    auto config = parse_config(c.toml);
    REQUIRE_FALSE(config);
    CHECK(config.error() == errc::invalid_config);
    CHECK_THAT(said(config), Catch::Contains(c.mentions));
  }
}

TEST_CASE("flags win over the environment, the environment over the file") {
  char path[] = "/tmp/toyvm-config-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  std::ofstream(path) << "[etcd]\nendpoints = [\"http://file:1\"]\n[placement]\nendpoint = \"http://file:2\"\n";

  setenv("TOYVM_CONFIG", path, 1);
  setenv("TOYVM_ETCD", "http://env:1,http://env:3", 1);
  unsetenv("TOYVM_PLACEMENT");
  auto config = load_config({});
  REQUIRE(config);
  CHECK(config->etcd.endpoints == std::vector<std::string>{"http://env:1", "http://env:3"});
  CHECK(config->placement.endpoint == "http://file:2");

  CommonOverrides flags;
  flags.etcd = "http://flag:1";
  flags.placement = "http://flag:2";
  config = load_config(flags);
  REQUIRE(config);
  CHECK(config->etcd.endpoints == std::vector<std::string>{"http://flag:1"});
  CHECK(config->placement.endpoint == "http://flag:2");

  flags.config_file = "/no/such/file.toml";
  CHECK_THAT(said(load_config(flags)), Catch::Contains("/no/such/file.toml"));

  unsetenv("TOYVM_CONFIG");
  unsetenv("TOYVM_ETCD");
  std::remove(path);
}

TEST_CASE("a config file holding a secret must not be readable by others") {
  char path[] = "/tmp/toyvm-secret-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  unsetenv("TOYVM_CONFIG");
  CommonOverrides flags;
  flags.config_file = path;

  std::ofstream(path) << "[placement]\ntoken = \"s3cret\"\n";
  chmod(path, 0644);
  const std::string refused = said(load_config(flags));
  CHECK_THAT(refused, Catch::Contains("readable by other users"));
  CHECK_THAT(refused, !Catch::Contains("s3cret"));  // never echoes the secret
  chmod(path, 0600);
  CHECK(load_config(flags).has_value());

  std::ofstream(path) << "[placement]\ntoken = \"s3cret\"\n[security]\nallow_readable_secrets = true\n";
  chmod(path, 0644);
  CHECK(load_config(flags).has_value());
  std::ofstream(path) << "[placement]\ntoken = \"admin\"\n";  // noauth's token is no secret
  CHECK(load_config(flags).has_value());
  std::remove(path);
}

TEST_CASE("endpoints without a scheme are bad usage, named with what is expected") {
  unsetenv("TOYVM_CONFIG");
  unsetenv("TOYVM_ETCD");
  unsetenv("TOYVM_PLACEMENT");
  CommonOverrides flags;
  flags.placement = "localhost:8080";
  auto config = load_config(flags);
  REQUIRE_FALSE(config);
  CHECK(config.error() == errc::invalid_config);
  CHECK_THAT(said(config), Catch::Contains("'localhost:8080'") && Catch::Contains("http://") && Catch::Contains("https://"));

  flags.placement = "https://placement.example:8778/placement";
  flags.etcd = "http://127.0.0.1:2379,etcd-2:2379";
  CHECK_THAT(said(load_config(flags)), Catch::Contains("etcd endpoint 'etcd-2:2379'"));

  for (const char* bad : {"http://", "ftp://etcd:2379", "http:///x"}) {
    flags.etcd = bad;
    CHECK_FALSE(load_config(flags));
  }
  flags.etcd = "https://etcd-1:2379, http://[::1]:2379";
  CHECK(load_config(flags).has_value());
}
