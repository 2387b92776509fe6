// Servers: what the tests run against them (toyvm, etcd and Placement calls) and read back.

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

std::unique_ptr<Process> Servers::spawn_toyvm(std::vector<std::string> args, const std::string& log_name) const {
  return std::make_unique<Process>(toyvm_argv(std::move(args)), dir() + "/" + log_name);
}

std::unique_ptr<Process> Servers::spawn_toyvm_paused(const std::string& point, const std::string& paused,
                                                     std::vector<std::string> args, const std::string& log_name) const {
  std::ofstream(paused) << "";
  ScopedEnv failpoints("TOYVM_FAILPOINTS", point + "=pause(" + paused + ")");
  auto process = spawn_toyvm(std::move(args), log_name);
  const std::string waiting = "failpoint " + point + ": paused";
  if (!wait_for([&] { return process->output().find(waiting) != std::string::npos; }, 20))
    throw std::runtime_error("toyvm did not pause at " + point + ": " + process->output());
  return process;
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
  std::vector<std::string> etcdctl{"etcdctl", "--endpoints", config.etcd.endpoints.front()};
  for (const auto& [flag, value] : {std::pair{"--cacert=", config.etcd.ca_file}, std::pair{"--cert=", config.etcd.cert_file},
                                    std::pair{"--key=", config.etcd.key_file}})
    if (!value.empty()) etcdctl.push_back(flag + value);
  if (!config.etcd.password.empty()) etcdctl.push_back("--user=" + config.etcd.user + ":" + config.etcd.password);
  etcdctl.insert(etcdctl.end(), {"compact", std::to_string(revision)});
  auto compacted = run_command(etcdctl, dir());
  // Nothing written since the last compaction: the history is compacted up to now already.
  if (compacted.exit_code != 0 && compacted.err.find("required revision has been compacted") == std::string::npos)
    throw std::runtime_error("etcdctl compact failed: " + compacted.err);
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
    ConsumerOwner owner{config.placement.consumer_project, config.placement.consumer_user};
    auto r = co_await placement.claim(consumer, allocations, std::move(owner));
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
    std::vector<ConsumerWrite> writes{{instance, std::move(there), held->generation, ConsumerType::instance, held->owner},
                                      {migration, held->allocations, std::nullopt, ConsumerType::migration, held->owner}};
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

}  // namespace toyvm::test
