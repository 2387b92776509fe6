#pragma once
// The compute agent's images. A name (or a file:// URL) is an entry in the image directory,
// used in place: a disk file, or a directory for direct kernel boot (kernel, initrd, and
// optionally cmdline and disk.qcow2 / disk.raw). An http(s) URL is fetched once into the
// cache; builds that want the same URL share one fetch, and a build that gives up waiting
// leaves the fetch to the others. The cache keeps to its size bound by dropping the least
// recently used images that no instance uses.

#include "core/async.hpp"
#include "virt/backend.hpp"

#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace toyvm {

struct ImageStoreOptions {
  std::string image_dir;
  std::string cache_dir;
  uint64_t cache_max_bytes = uint64_t(20) << 30;
  uint64_t max_download_bytes = uint64_t(20) << 30;
  std::vector<std::string> schemes{"http", "https", "file"};
  std::chrono::milliseconds idle_timeout{30'000};
  std::string ca_file;
};

class ImageStore {
 public:
  ImageStore(asio::any_io_executor executor, asio::thread_pool& pool, ImageStoreOptions options);

  // Resolves `ref` into local files; failures carry the reason image_failure. `format` is
  // schedule's --image-format (empty: as the name says, see declared_format). Waits on
  // `wake` (a timer that never expires by itself): cancelling it gives up and yields nullopt.
  awaitable<std::optional<result<BootImage>>> acquire(std::string ref, std::string sha256, std::string format,
                                                           asio::steady_timer& wake);

  // The cache file a URL reference is fetched to; empty for anything else.
  std::string cache_path(const std::string& ref) const;

  // Drops cached images, least recently used first, until the cache fits its bound; files
  // in `in_use` stay. Blocking (file system).
  void trim(const std::set<std::string>& in_use) const;

  // A name or file reference resolved into the image directory's files (a single disk, or a
  // directory with a kernel, initrd, cmdline and disk), checked against `sha256` when given.
  // Blocking (file system).
  result<BootImage> resolve_local(const ImageRef& ref, const std::string& sha256,
                                  std::optional<DiskFormat> declared) const;

 private:
  struct Fetch {
    bool done = false;
    std::string error;
    std::string sha256;
    std::vector<asio::steady_timer*> waiters;
  };

  awaitable<void> fetch(ImageRef ref, std::string path, std::shared_ptr<Fetch> fetch);

  asio::any_io_executor executor_;
  asio::thread_pool& pool_;
  ImageStoreOptions options_;
  std::map<std::string, std::shared_ptr<Fetch>> fetches_;  // by cache path
};

}  // namespace toyvm
