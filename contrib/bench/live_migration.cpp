#include "live_migration.hpp"

#include "model/uuid.hpp"
#include "virt/backend.hpp"
#include "virt/images.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

using namespace toyvm;
namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `virsh migrate` as an operator would run it, with what the backend's move passes; its time.
result<MigrationStats> virsh_migrate(const std::string& client_uri, const std::string& uuid, const MigrationTarget& to,
                                     const std::string& dir) {
  const std::string xml_file = dir + "/destination.xml";
  std::ofstream(xml_file) << to.domain_xml;
  const std::string command = "virsh -q -c '" + client_uri +
                              "' migrate --live --p2p --persistent --undefinesource --copy-storage-inc --xml " +
                              xml_file + " --persistent-xml " + xml_file + " --migrateuri '" + to.migration_uri +
                              "' " + uuid + " '" + to.libvirt_uri + "'";
  const auto started = std::chrono::steady_clock::now();
  if (std::system(command.c_str()) != 0) return Error(errc::launch_failure, "virsh migrate failed");
  MigrationStats stats;
  stats.total_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started)
                       .count();
  return stats;
}

template <class Done>
bool wait_until(Done done, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return true;
}

}  // namespace

int run_live_migration(const LiveMigrationOptions& o) {
  auto open = [&](const std::string& uri, const std::string& name, const std::string& owner) {
    LibvirtOptions options;
    options.uri = uri;
    options.domain_type = "qemu";
    options.instance_dir = o.dir + "/" + name;
    options.network = "default";
    options.owner = owner;
    fs::create_directories(options.instance_dir);
    return open_libvirt(options);
  };
  auto a = open(o.from, "a", "aaaaaaaa-0000-4000-8000-00000000000a");
  auto b = open(o.to, "b", "bbbbbbbb-0000-4000-8000-00000000000b");
  if (!a || !b) {
    std::fprintf(stderr, "toyvm-bench: %s\n", (!a ? a.error() : b.error()).message().c_str());
    return 1;
  }
  // The guest's files as an agent resolves a directory image in its image dir.
  const fs::path image_dir = fs::canonical(o.image_dir);
  asio::io_context io;
  asio::thread_pool pool(1);
  ImageStoreOptions image_options;
  image_options.image_dir = image_dir.parent_path().string();
  ImageRef image_ref;
  image_ref.name = image_dir.filename().string();
  auto image = ImageStore(io.get_executor(), pool, image_options)
                   .resolve_local(image_ref, "", std::nullopt);
  if (!image) {
    std::fprintf(stderr, "toyvm-bench: %s\n", image.error().message().c_str());
    return 1;
  }
  DomainSpec spec;
  spec.uuid = new_uuid();
  spec.name = spec.uuid;
  spec.memory_mb = 128;
  spec.disk_gb = 1;
  spec.image = *image;
  spec.mac = instance_mac(spec.uuid);
  if (auto made = (*a)->create(spec); !made) {
    std::fprintf(stderr, "toyvm-bench: %s\n", made.error().message().c_str());
    return 1;
  }
  const std::string log = console_log_path(o.dir + "/a", spec.uuid);
  const bool running = wait_until([&] { return read_text(log).find("toyvm-guest: tick") != std::string::npos; },
                                  std::chrono::seconds(300));
  if (auto found = (*a)->addresses(spec.uuid); found && !found->empty()) spec.ip = found->front().ip;

  VirtBackend* here = a->get();
  VirtBackend* there = b->get();
  std::string there_uri = o.to, here_uri = o.back.empty() ? o.from : o.back;
  std::string here_client = o.from, there_client = o.to;  // as this process reaches them
  json::array total, downtime, bytes;
  int moved_count = 0;
  for (int round = 0; running && round < o.rounds; ++round) {
    auto xml = there->prepare_incoming(spec);
    const MigrationTarget target{there_uri, "tcp://127.0.0.1", xml ? *xml : std::string()};
    auto moved = !xml      ? result<MigrationStats>(xml.error())
                 : o.virsh ? virsh_migrate(here_client, spec.uuid, target, o.dir)
                           : here->migrate(spec.uuid, target);
    if (!moved) {
      std::fprintf(stderr, "toyvm-bench: round %d: %s\n", round + 1, moved.error().message().c_str());
      break;
    }
    total.emplace_back(moved->total_ms);
    downtime.emplace_back(moved->downtime_ms);
    bytes.emplace_back(moved->bytes);
    ++moved_count;
    std::swap(here, there);
    std::swap(here_uri, there_uri);
    std::swap(here_client, there_client);
  }
  here->destroy(spec.uuid);
  json::object out{{"rounds", moved_count}, {"total_ms", total}, {"downtime_ms", downtime}, {"bytes", bytes}};
  std::printf("%s\n", json::serialize(out).c_str());
  return moved_count == o.rounds ? 0 : 1;
}
