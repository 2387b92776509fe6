#include "virt/images.hpp"

#include "clients/download.hpp"
#include "core/sha256.hpp"

#include <boost/asio/as_tuple.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace toyvm {
namespace {

namespace fs = std::filesystem;

Error image_failure(std::string message) {
  return Error(errc::image_failure, std::move(message));
}

// The first bytes of a file (enough for any header toyvm reads) and its size.
bool read_head(const fs::path& path, std::string& head, uint64_t& size, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = fmt::format("cannot read {}", path.string());
    return false;
  }
  head.resize(4096);
  in.read(head.data(), std::streamsize(head.size()));
  head.resize(size_t(in.gcount()));
  std::error_code ec;
  size = fs::file_size(path, ec);
  if (ec) error = fmt::format("cannot read {}: {}", path.string(), ec.message());
  return !ec;
}

std::string file_sha256(const fs::path& path, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = fmt::format("cannot read {}", path.string());
    return {};
  }
  Sha256 sha;
  std::vector<char> chunk(1 << 20);
  while (in) {
    in.read(chunk.data(), std::streamsize(chunk.size()));
    sha.update(chunk.data(), size_t(in.gcount()));
  }
  return sha.hex();
}

// A disk image in the format its reference declares. Raw is taken as raw, whatever its first
// bytes say; a qcow2 must be one (and a plain one). A file whose reference says nothing is
// raw only if it does not look like qcow2: one that does is refused rather than guessed.
result<BootImage> probe_disk_file(const fs::path& path, std::optional<DiskFormat> declared) {
  std::string head, error;
  uint64_t size = 0;
  if (!read_head(path, head, size, error)) return image_failure(error);
  if (!declared && has_qcow2_magic(head))
    return image_failure(fmt::format(
        "{} has a qcow2 header but its reference does not say its format: name it .qcow2 or .raw, or give "
        "--image-format",
        path.string()));
  auto disk = declared == DiskFormat::raw ? result<DiskInfo>(DiskInfo{DiskFormat::raw, size})
                                          : probe_disk(head, size);
  if (disk && size == 0) disk = Error(errc::corrupt_record, "the image is empty");
  if (!disk) return image_failure(fmt::format("{} is not a usable disk image: {}", path.string(), disk.error().message()));
  if (declared == DiskFormat::qcow2 && disk->format != DiskFormat::qcow2)
    return image_failure(fmt::format("{} is not a qcow2 image", path.string()));
  BootImage image;
  image.disk = path.string();
  image.disk_format = disk->format;
  image.disk_size = disk->virtual_size;
  return image;
}

}  // namespace

ImageStore::ImageStore(asio::any_io_executor executor, asio::thread_pool& pool, ImageStoreOptions options)
    : executor_(std::move(executor)), pool_(pool), options_(std::move(options)) {}

std::string ImageStore::cache_path(const std::string& text) const {
  auto ref = parse_image_ref(text, options_.schemes);
  if (!ref || (ref->kind != ImageRef::Kind::http && ref->kind != ImageRef::Kind::https)) return {};
  return options_.cache_dir + "/" + sha256_hex(ref->url).substr(0, 32) + ".img";
}

awaitable<std::optional<result<BootImage>>> ImageStore::acquire(std::string text, std::string sha256,
                                                                      std::string format, asio::steady_timer& wake) {
  auto ref = parse_image_ref(text, options_.schemes);
  if (!ref) co_return image_failure(ref.error().message());
  if (!sha256.empty() && !is_sha256_hex(sha256)) co_return image_failure("the expected sha256 is not 64 hex digits");
  if (!format.empty() && !parse_disk_format(format))
    co_return image_failure(fmt::format("image format '{}' is unknown (raw or qcow2)", format));
  const std::optional<DiskFormat> declared = declared_format(*ref, format);
  if (ref->kind == ImageRef::Kind::name || ref->kind == ImageRef::Kind::file) {
    auto resolve = [this, ref = *ref, sha256, declared] { return resolve_local(ref, sha256, declared); };
    co_return co_await run_blocking(pool_, std::move(resolve));
  }

  std::string path = cache_path(text);
  std::shared_ptr<Fetch>& slot = fetches_[path];
  std::shared_ptr<Fetch> fetching = slot;
  if (!fetching) {
    fetching = slot = std::make_shared<Fetch>();
    asio::co_spawn(executor_, fetch(*ref, path, fetching), asio::detached);
  }
  fetching->waiters.push_back(&wake);
  co_await wake.async_wait(asio::as_tuple(use_awaitable));
  std::erase(fetching->waiters, &wake);
  if (!fetching->done) co_return std::nullopt;
  if (!fetching->error.empty()) co_return image_failure(fmt::format("fetching {}: {}", text, fetching->error));
  if (!sha256.empty() && sha256 != fetching->sha256)
    co_return image_failure(fmt::format("{} has sha256 {}, expected {}", text, fetching->sha256, sha256));
  auto probe = [path, declared] {
    ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // recently used: trimmed last
    return probe_disk_file(path, declared);
  };
  co_return co_await run_blocking(pool_, std::move(probe));
}

// Downloads into <path>.part and renames it into place once complete, with the digest in
// <path>.sha256 beside it; an image already cached is not fetched again.
awaitable<void> ImageStore::fetch(ImageRef ref, std::string path, std::shared_ptr<Fetch> fetching) {
  auto cached = [path] {
    std::ifstream digest(path + ".sha256");
    std::string sha;
    std::error_code ec;
    if (digest >> sha && fs::exists(path, ec) && is_sha256_hex(sha)) return sha;
    return std::string();
  };
  fetching->sha256 = co_await run_blocking(pool_, std::move(cached));
  if (fetching->sha256.empty()) {
    std::string partial = path + ".part";
    std::error_code ec;
    fs::create_directories(options_.cache_dir, ec);
    fs::permissions(options_.cache_dir, fs::perms(0755), ec);  // QEMU reads the base images
    int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      fetching->error = fmt::format("cannot write {}: {}", partial, std::strerror(errno));
    } else {
      spdlog::info("fetching image {}", ref.url);
      DownloadRequest request{ref.kind == ImageRef::Kind::https, ref.host, ref.port, ref.target,
                              options_.max_download_bytes, options_.idle_timeout, options_.ca_file};
      DownloadResult got = co_await download_to_fd(executor_, request, fd);
      auto finish = [fd, partial, path, got] {
        bool written = got.error.empty() && ::fsync(fd) == 0;
        ::close(fd);
        std::ofstream digest(path + ".sha256");
        written = written && bool(digest << got.sha256 << '\n') && bool(digest.flush());
        std::error_code ec;
        if (written) fs::rename(partial, path, ec);
        if (!written || ec) fs::remove(partial, ec);
        return written && !ec;
      };
      bool stored = co_await run_blocking(pool_, std::move(finish));
      if (!got.error.empty()) {
        fetching->error = got.error;
      } else if (!stored) {
        fetching->error = fmt::format("cannot store {} in {}", ref.url, options_.cache_dir);
      } else {
        fetching->sha256 = got.sha256;
        spdlog::info("fetched image {}: {} bytes, sha256 {}", ref.url, got.bytes, got.sha256);
      }
    }
  }
  fetching->done = true;
  fetches_.erase(path);
  for (asio::steady_timer* waiter : fetching->waiters) waiter->cancel();
}

result<BootImage> ImageStore::resolve_local(const ImageRef& ref, const std::string& sha256,
                                                std::optional<DiskFormat> declared) const {
  std::error_code ec;
  fs::path root = fs::canonical(options_.image_dir, ec);
  if (ec) return image_failure(fmt::format("the image directory {} does not exist", options_.image_dir));
  fs::path wanted = ref.kind == ImageRef::Kind::name ? root / ref.name : fs::path(ref.path);
  std::string shown = ref.kind == ImageRef::Kind::name ? ref.name : ref.path;
  // Symlinks resolved first: a link inside the image dir may not lead out of it.
  auto inside = [&](const fs::path& path, fs::path& real) -> std::optional<std::string> {
    std::error_code error;
    real = fs::canonical(path, error);
    if (error) return fmt::format("image '{}' not found in {}", shown, root.string());
    if (!path_within(root.string(), real.string()))
      return fmt::format("image '{}' is outside the image directory {}", shown, root.string());
    return std::nullopt;
  };
  fs::path real;
  if (auto refused = inside(wanted, real)) return image_failure(*refused);

  if (fs::is_regular_file(real, ec)) {
    if (!sha256.empty()) {
      std::string error, digest = file_sha256(real, error);
      if (!error.empty()) return image_failure(error);
      if (digest != sha256)
        return image_failure(fmt::format("image '{}' has sha256 {}, expected {}", shown, digest, sha256));
    }
    return probe_disk_file(real, declared);
  }
  if (!fs::is_directory(real, ec)) return image_failure(fmt::format("image '{}' is not a file", shown));
  if (!sha256.empty()) return image_failure("an expected sha256 applies to single-file images only");

  BootImage image;
  fs::path file;
  if (auto refused = inside(real / "kernel", file)) return image_failure(*refused + " (no kernel)");
  std::string head, error;
  uint64_t size = 0;
  if (!read_head(file, head, size, error)) return image_failure(error);
  if (!is_bzimage(head)) return image_failure(fmt::format("{} is not a Linux kernel", file.string()));
  image.kernel = file.string();
  if (fs::exists(real / "initrd", ec)) {
    if (auto refused = inside(real / "initrd", file)) return image_failure(*refused);
    image.initrd = file.string();
  }
  if (fs::exists(real / "cmdline", ec)) {
    if (auto refused = inside(real / "cmdline", file)) return image_failure(*refused);
    std::ifstream in(file);
    std::getline(in, image.cmdline);
    if (image.cmdline.size() > 2048) return image_failure("the kernel command line is over 2048 bytes");
  }
  for (auto [name, format] : {std::pair{"disk.qcow2", DiskFormat::qcow2}, std::pair{"disk.raw", DiskFormat::raw}}) {
    if (!fs::exists(real / name, ec)) continue;
    if (auto refused = inside(real / name, file)) return image_failure(*refused);
    auto disk = probe_disk_file(file, format);
    if (!disk) return disk;
    image.disk = disk->disk;
    image.disk_format = disk->disk_format;
    image.disk_size = disk->disk_size;
    break;
  }
  return image;
}

void ImageStore::trim(const std::set<std::string>& in_use) const {
  struct Entry {
    fs::path path;
    uint64_t size;
    fs::file_time_type used;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(options_.cache_dir, ec)) {
    if (item.path().extension() != ".img") continue;
    std::error_code e;
    Entry entry{item.path(), item.file_size(e), item.last_write_time(e)};
    if (e) continue;
    total += entry.size;
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.used < b.used; });
  for (const Entry& entry : entries) {
    if (total <= options_.cache_max_bytes) break;
    if (in_use.count(entry.path.string())) continue;
    fs::remove(entry.path, ec);
    fs::remove(entry.path.string() + ".sha256", ec);
    total -= entry.size;
    spdlog::info("image cache: dropped {} ({} bytes)", entry.path.string(), entry.size);
  }
}

}  // namespace toyvm
