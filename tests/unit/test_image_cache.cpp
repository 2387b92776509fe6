#include "virt/images.hpp"

#include "catch_result.hpp"

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>

using namespace toyvm;
namespace fs = std::filesystem;

namespace {

struct CacheDir {
  fs::path path = fs::temp_directory_path() / ("toyvm-cache-test-" + std::to_string(::getpid()));
  CacheDir() { fs::create_directories(path); }
  ~CacheDir() { fs::remove_all(path); }

  // An image of `size` bytes last used `age` ago.
  std::string add(const std::string& name, size_t size, std::chrono::hours age) {
    fs::path file = path / (name + ".img");
    std::ofstream(file) << std::string(size, 'x');
    std::ofstream(path / (name + ".img.sha256")) << "digest\n";
    fs::last_write_time(file, fs::file_time_type::clock::now() - age);
    return file.string();
  }
};

}  // namespace

TEST_CASE("the image cache drops the least recently used images nobody uses, down to its bound") {
  CacheDir dir;
  asio::io_context io;
  asio::thread_pool pool(1);
  ImageStoreOptions options;
  options.cache_dir = dir.path.string();
  options.cache_max_bytes = 2500;
  ImageStore store(io.get_executor(), pool, options);

  std::string oldest = dir.add("oldest", 1000, std::chrono::hours(30));
  std::string old_in_use = dir.add("old-in-use", 1000, std::chrono::hours(20));
  std::string older = dir.add("older", 1000, std::chrono::hours(10));
  std::string newest = dir.add("newest", 1000, std::chrono::hours(1));

  store.trim({old_in_use});
  CHECK_FALSE(fs::exists(oldest));
  CHECK_FALSE(fs::exists(oldest + ".sha256"));
  CHECK(fs::exists(old_in_use));  // in use: kept although old
  CHECK_FALSE(fs::exists(older));
  CHECK(fs::exists(newest));

  store.trim({});  // 2000 bytes fit: nothing more goes
  CHECK(fs::exists(old_in_use));
  CHECK(fs::exists(newest));
  pool.join();
}

TEST_CASE("only http(s) references have a cache path, one per URL") {
  asio::io_context io;
  asio::thread_pool pool(1);
  ImageStoreOptions options;
  options.cache_dir = "/var/cache/toyvm";
  ImageStore store(io.get_executor(), pool, options);
  std::string a = store.cache_path("http://images.example/a.qcow2");
  CHECK(a.starts_with("/var/cache/toyvm/"));
  CHECK(a.ends_with(".img"));
  CHECK(a != store.cache_path("https://images.example/a.qcow2"));
  CHECK(store.cache_path("a.qcow2").empty());
  CHECK(store.cache_path("file:///srv/a.qcow2").empty());
  CHECK(store.cache_path("ftp://x/y").empty());
  pool.join();
}
