#include "core/config.hpp"

#include "core/address.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace toyvm {
namespace {

Error invalid(std::string message) { return Error(errc::invalid_config, std::move(message)); }

// Reads one table, rejecting keys it does not know.
class TableReader {
 public:
  TableReader(const toml::table* table, std::string name, std::string* error)
      : table_(table), name_(std::move(name)), error_(error) {}

  template <class T>
  void get(const char* key, T& out) {
    known_.insert(key);
    if (!table_ || !error_->empty()) return;
    const toml::node* node = table_->get(key);
    if (!node) return;
    if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      const toml::array* array = node->as_array();
      if (!array) return wrong_type(key, "an array of strings");
      out.clear();
      for (const toml::node& item : *array) {
        auto text = item.value<std::string>();
        if (!text) return wrong_type(key, "an array of strings");
        out.push_back(*text);
      }
    } else if constexpr (std::is_same_v<T, bool>) {
      auto value = node->value<bool>();
      if (!value || !node->is_boolean()) return wrong_type(key, "true or false");
      out = *value;
    } else if constexpr (std::is_same_v<T, std::chrono::seconds>) {
      auto value = node->value<int64_t>();
      if (!value || !node->is_integer()) return wrong_type(key, "a whole number of seconds");
      out = std::chrono::seconds(*value);
    } else if constexpr (std::is_same_v<T, Duration>) {
      auto value = node->value<double>();  // accepts integers too
      if (!value) return wrong_type(key, "a number of seconds");
      out = from_seconds(*value);
    } else if constexpr (std::is_same_v<T, double>) {
      auto value = node->value<double>();  // accepts integers too
      if (!value) return wrong_type(key, "a number");
      out = *value;
    } else if constexpr (std::is_integral_v<T>) {
      auto value = node->value<int64_t>();
      if (!value || !node->is_integer()) return wrong_type(key, "an integer");
      out = T(*value);
    } else {
      auto value = node->value<std::string>();
      if (!value) return wrong_type(key, "a string");
      out = *value;
    }
  }

  void finish() {
    if (!table_ || !error_->empty()) return;
    for (auto& [key, node] : *table_) {
      if (!known_.count(std::string(key.str())))
        *error_ = fmt::format("unknown key '{}' in [{}]", key.str(), name_);
    }
  }

 private:
  void wrong_type(const char* key, const char* what) {
    *error_ = fmt::format("'{}' in [{}] must be {}", key, name_, what);
  }
  const toml::table* table_;
  std::string name_;
  std::string* error_;
  std::set<std::string> known_;
};

}  // namespace

std::vector<std::string> split_endpoints(std::string_view list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    std::string_view item = list.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    start = end + 1;
  }
  return out;
}

namespace {

// Endpoints are URLs: "localhost:8080" would otherwise fail later as an unreachable server.
std::string check_url(std::string_view what, std::string_view url) {
  if (is_http_url(url)) return {};
  return fmt::format("{} '{}' is not a URL: expected http://HOST:PORT or https://HOST:PORT", what, url);
}

// Placement's rule for custom trait names.
bool is_custom_trait(std::string_view name) {
  constexpr std::string_view custom = "CUSTOM_";
  if (!name.starts_with(custom) || name.size() == custom.size() || name.size() > 255) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; });
}

}  // namespace

result<Config> parse_config(std::string_view text) {
  Config config;
  toml::table root;
  try {
    root = toml::parse(text);
  } catch (const toml::parse_error& e) {
    return invalid(fmt::format("line {}: {}", e.source().begin.line, e.description()));
  }
  std::string error;
  auto section = [&](const char* name) -> const toml::table* {
    const toml::node* node = root.get(name);
    if (node && !node->is_table()) error = fmt::format("[{}] must be a table", name);
    return node ? node->as_table() : nullptr;
  };

  TableReader etcd(section("etcd"), "etcd", &error);
  etcd.get("endpoints", config.etcd.endpoints);
  etcd.get("prefix", config.etcd.prefix);
  etcd.get("timeout", config.etcd.timeout);
  etcd.get("ca_file", config.etcd.ca_file);
  etcd.get("cert_file", config.etcd.cert_file);
  etcd.get("key_file", config.etcd.key_file);
  etcd.get("server_name", config.etcd.server_name);
  etcd.get("user", config.etcd.user);
  etcd.get("password", config.etcd.password);
  etcd.finish();

  TableReader placement(section("placement"), "placement", &error);
  placement.get("endpoint", config.placement.endpoint);
  placement.get("token", config.placement.token);
  placement.get("token_header", config.placement.token_header);
  placement.get("timeout", config.placement.timeout);
  placement.get("candidate_limit", config.placement.candidate_limit);
  placement.get("shards", config.placement.shards);
  placement.get("sample_hosts", config.placement.sample_hosts);
  placement.get("ca_file", config.placement.ca_file);
  placement.get("auth_url", config.placement.auth_url);
  placement.get("user", config.placement.user);
  placement.get("password", config.placement.password);
  placement.get("project", config.placement.project);
  placement.get("user_domain", config.placement.user_domain);
  placement.get("project_domain", config.placement.project_domain);
  placement.get("consumer_project", config.placement.consumer_project);
  placement.get("consumer_user", config.placement.consumer_user);
  placement.get("provider_trait", config.placement.provider_trait);
  placement.finish();

  ComputeConfig& c = config.compute;
  TableReader compute(section("compute"), "compute", &error);
  compute.get("state_dir", c.state_dir);
  compute.get("instance_dir", c.instance_dir);
  compute.get("libvirt_uri", c.libvirt_uri);
  compute.get("domain_type", c.domain_type);
  compute.get("name", c.name);
  compute.get("inventory", c.inventory);
  compute.get("traits", c.traits);
  compute.get("availability_zone", c.availability_zone);
  compute.get("metadata_interface", c.metadata_interface);
  compute.get("config_drive", c.config_drive);
  compute.get("lease_ttl", c.lease_ttl);
  compute.get("workers", c.workers);
  compute.get("max_instances", c.max_instances);
  compute.get("resync_interval", c.resync_interval);
  compute.get("stats_interval", c.stats_interval);
  compute.get("on_guest_crash", c.on_guest_crash);
  compute.get("metrics_listen", c.metrics_listen);
  compute.get("max_build_attempts", c.max_build_attempts);
  compute.get("image_dir", c.image_dir);
  compute.get("image_cache_dir", c.image_cache_dir);
  compute.get("image_cache_max_gb", c.image_cache_max_gb);
  compute.get("image_max_gb", c.image_max_gb);
  compute.get("image_schemes", c.image_schemes);
  compute.get("image_ca_file", c.image_ca_file);
  compute.get("network", c.network);
  compute.get("bridge", c.bridge);
  compute.get("nic_model", c.nic_model);
  compute.get("guest_filter", c.guest_filter);
  compute.get("address_timeout", c.address_timeout);
  compute.get("stop_timeout", c.stop_timeout);
  compute.get("console_interval", c.console_interval);
  compute.get("move_libvirt_uri", c.move_libvirt_uri);
  compute.get("move_address", c.move_address);
  compute.get("move_prepare_timeout", c.move_prepare_timeout);
  compute.get("live_migration_completion_timeout", c.live_migration_completion_timeout);
  compute.get("max_concurrent_moves", c.max_concurrent_moves);
  compute.get("reserved_vcpu", c.policy.reserved_vcpu);
  compute.get("reserved_memory_mb", c.policy.reserved_memory_mb);
  compute.get("reserved_disk_gb", c.policy.reserved_disk_gb);
  compute.get("cpu_allocation_ratio", c.policy.cpu_allocation_ratio);
  compute.get("ram_allocation_ratio", c.policy.ram_allocation_ratio);
  compute.get("disk_allocation_ratio", c.policy.disk_allocation_ratio);
  compute.finish();

  TableReader schedule(section("schedule"), "schedule", &error);
  schedule.get("image", config.schedule.image);
  schedule.get("max_claim_attempts", config.schedule.max_claim_attempts);
  schedule.get("policy", config.schedule.policy);
  schedule.get("ram_weight_multiplier", config.schedule.ram_weight_multiplier);
  schedule.get("cpu_weight_multiplier", config.schedule.cpu_weight_multiplier);
  schedule.get("disk_weight_multiplier", config.schedule.disk_weight_multiplier);
  schedule.get("host_subset_size", config.schedule.host_subset_size);
  schedule.get("project", config.schedule.project);
  schedule.finish();

  TableReader mdserver(section("mdserver"), "mdserver", &error);
  mdserver.get("listen", config.mdserver.listen);
  mdserver.get("metrics_listen", config.mdserver.metrics_listen);
  mdserver.get("max_connections", config.mdserver.max_connections);
  mdserver.get("idle_timeout", config.mdserver.idle_timeout);
  mdserver.get("availability_zone", config.mdserver.availability_zone);
  mdserver.get("guest_networks", config.mdserver.guest_networks);
  mdserver.get("rate_limit", config.mdserver.rate_limit);
  mdserver.get("rate_burst", config.mdserver.rate_burst);
  mdserver.finish();

  TableReader security(section("security"), "security", &error);
  security.get("allow_readable_secrets", config.security.allow_readable_secrets);
  security.finish();

  for (auto& [key, node] : root) {
    static const std::set<std::string> sections{"etcd", "placement", "compute", "schedule", "mdserver",
                                                "security"};
    if (error.empty() && !sections.count(std::string(key.str())))
      error = fmt::format("unknown section [{}]", key.str());
  }
  if (error.empty() && config.etcd.endpoints.empty()) error = "etcd.endpoints is empty";
  if (error.empty() && !is_custom_trait(config.placement.provider_trait))
    error = "placement.provider_trait must be CUSTOM_ followed by A-Z, 0-9 and _ (255 characters at most)";
  if (error.empty() && config.schedule.policy != "spread" && config.schedule.policy != "pack")
    error = "schedule.policy must be \"spread\" or \"pack\"";
  if (error.empty() && config.compute.on_guest_crash != "restart" && config.compute.on_guest_crash != "error")
    error = "compute.on_guest_crash must be \"restart\" or \"error\"";
  using std::chrono::seconds;
  if (error.empty() && (config.compute.lease_ttl < seconds(2) || config.compute.workers < 1 ||
                        config.compute.resync_interval < Duration(100) || config.compute.max_build_attempts < 1 ||
                        config.compute.stats_interval < seconds(1)))
    error = "compute.lease_ttl must be >= 2, workers and max_build_attempts >= 1, resync_interval >= 0.1, "
            "stats_interval >= 1";
  if (error.empty() && (config.compute.max_concurrent_moves < 1 || !(config.compute.live_migration_completion_timeout > 0)))
    error = "compute.max_concurrent_moves must be >= 1 and live_migration_completion_timeout > 0";
  if (!error.empty()) return invalid(std::move(error));
  return config;
}

result<Config> load_config(const CommonOverrides& flags) {
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value ? value : "";
  };
  std::string path = !flags.config_file.empty() ? flags.config_file : env("TOYVM_CONFIG");
  std::string text;
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) {
      return invalid(fmt::format("cannot read config file {}", path));
    }
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  }
  auto config = parse_config(text);
  if (!config) return invalid(fmt::format("{}: {}", path, config.error().message()));
  struct stat info {};
  const bool holds_secret = config->placement.token != PlacementConfig{}.token || !config->etcd.password.empty() ||
                            !config->placement.password.empty();
  if (!path.empty() && holds_secret && !config->security.allow_readable_secrets && stat(path.c_str(), &info) == 0 && (info.st_mode & 077)) {
    return invalid(fmt::format("{} holds a secret and is readable by other users (mode {:o}); chmod 600 it, or set "
                            "[security] allow_readable_secrets = true",
                            path, info.st_mode & 0777));
  }
  config->source_file = path;
  std::string etcd = !flags.etcd.empty() ? flags.etcd : env("TOYVM_ETCD");
  if (!etcd.empty()) config->etcd.endpoints = split_endpoints(etcd);
  EtcdConfig& etcd_tls = config->etcd;
  for (auto [flag, setting] : {std::pair{&flags.etcd_ca, &etcd_tls.ca_file}, std::pair{&flags.etcd_cert, &etcd_tls.cert_file},
                               std::pair{&flags.etcd_key, &etcd_tls.key_file},
                               std::pair{&flags.etcd_server_name, &etcd_tls.server_name},
                               std::pair{&flags.etcd_user, &etcd_tls.user}})
    if (!flag->empty()) *setting = *flag;
  if (std::string password = env("TOYVM_ETCD_PASSWORD"); !password.empty()) etcd_tls.password = password;
  std::string placement = !flags.placement.empty() ? flags.placement : env("TOYVM_PLACEMENT");
  if (!placement.empty()) config->placement.endpoint = placement;
  if (config->etcd.endpoints.empty()) {
    return invalid("no etcd endpoint given");
  }
  std::string bad_url = check_url("the Placement endpoint", config->placement.endpoint);
  if (bad_url.empty() && !config->placement.auth_url.empty())
    bad_url = check_url("placement.auth_url", config->placement.auth_url);
  for (const std::string& endpoint : config->etcd.endpoints)
    if (bad_url.empty()) bad_url = check_url("the etcd endpoint", endpoint);
  if (!bad_url.empty()) {
    return invalid(std::move(bad_url));
  }
  // TLS material is read when the etcd channel is made; missing files are reported here.
  const EtcdConfig& etcd_config = config->etcd;
  if (etcd_config.cert_file.empty() != etcd_config.key_file.empty()) {
    return invalid("etcd.cert_file and etcd.key_file go together");
  }
  for (const std::string* file : std::initializer_list<const std::string*>{
           &etcd_config.ca_file, &etcd_config.cert_file, &etcd_config.key_file, &config->placement.ca_file}) {
    if (!file->empty() && !std::ifstream(*file)) {
      return invalid(fmt::format("cannot read {}", *file));
    }
  }
  const PlacementConfig& placement_config = config->placement;
  if (!placement_config.auth_url.empty() &&
      (placement_config.user.empty() || placement_config.password.empty() || placement_config.project.empty())) {
    return invalid("placement.auth_url needs placement.user, placement.password and placement.project");
  }
  // A user without a password is the common name of the client certificate (etcd's
  // --client-cert-auth): it signs in with the certificate, and the name says who it is.
  if (etcd_config.user.empty() ? !etcd_config.password.empty()
                               : etcd_config.password.empty() && etcd_config.cert_file.empty()) {
    return invalid("etcd.user needs etcd.password, or a cert_file whose common name it is");
  }
  return config;
}

}  // namespace toyvm
