#include "virt/config_drive.hpp"

#include <dlfcn.h>
#include <fcntl.h>
// No libburn here: libisofs then declares struct burn_source itself, through which the
// volume is read.
#define LIBISOFS_WITHOUT_LIBBURN 1
#include <libisofs/libisofs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace toyvm {
namespace {

constexpr const char* volume_label = "config-2";
constexpr int block_size = 2048;

// libisofs is loaded when the first drive is made, as libvirt is: only the agent makes them,
// and the short commands should not spend their start-up resolving its libraries.
#define TOYVM_ISOFS_FUNCTIONS(X) \
  X(iso_init)                    \
  X(iso_set_msgs_severities)     \
  X(iso_error_to_msg)            \
  X(iso_image_new)               \
  X(iso_image_unref)             \
  X(iso_image_get_root)          \
  X(iso_image_add_new_dir)       \
  X(iso_image_add_new_file)      \
  X(iso_memory_stream_new)       \
  X(iso_stream_unref)            \
  X(iso_node_set_permissions)    \
  X(iso_write_opts_new)          \
  X(iso_write_opts_free)         \
  X(iso_write_opts_set_joliet)   \
  X(iso_image_create_burn_source)

struct IsofsApi {
#define TOYVM_ISOFS_POINTER(name) decltype(&::name) name = nullptr;
  TOYVM_ISOFS_FUNCTIONS(TOYVM_ISOFS_POINTER)
#undef TOYVM_ISOFS_POINTER
};

const IsofsApi* isofs = nullptr;

result<void> load_libisofs() {
  static IsofsApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* handle = dlopen("libisofs.so.6", RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      error = std::string("config drive: cannot load libisofs: ") + dlerror();
      return;
    }
#define TOYVM_ISOFS_RESOLVE(name)                                          \
  api.name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name));    \
  if (!api.name) {                                                         \
    error = "config drive: libisofs has no " #name;                        \
    return;                                                                \
  }
    TOYVM_ISOFS_FUNCTIONS(TOYVM_ISOFS_RESOLVE)
#undef TOYVM_ISOFS_RESOLVE
    api.iso_init();
    // Its messages would go to stderr unasked; failures reach us as return codes.
    api.iso_set_msgs_severities(const_cast<char*>("NEVER"), const_cast<char*>("NEVER"), const_cast<char*>("toyvm"));
    isofs = &api;
  });
  if (!isofs) return Error(errc::launch_failure, error);
  return {};
}

struct IsoImageRef {
  IsoImage* image = nullptr;
  ~IsoImageRef() {
    if (image) isofs->iso_image_unref(image);
  }
};

struct OptsRef {
  IsoWriteOpts* opts = nullptr;
  ~OptsRef() {
    if (opts) isofs->iso_write_opts_free(opts);
  }
};

struct SourceRef {
  burn_source* source = nullptr;
  bool drained = false;  // read to its end: libisofs' writer thread is done
  ~SourceRef() {
    if (!source) return;
    if (!drained && source->cancel) source->cancel(source);  // ends the writer thread
    source->free_data(source);
    free(source);
  }
};

std::string iso_failure(const char* doing, int code) {
  return fmt::format("config drive: {}: {}", doing, isofs->iso_error_to_msg(code));
}

// The directory at `path` ("openstack/latest"), made on the way.
IsoDir* directory(IsoImage* image, std::map<std::string, IsoDir*>& made, const std::string& path, int* code) {
  if (path.empty()) return isofs->iso_image_get_root(image);
  if (auto found = made.find(path); found != made.end()) return found->second;
  size_t slash = path.rfind('/');
  std::string parent_path = slash == std::string::npos ? "" : path.substr(0, slash);
  IsoDir* parent = directory(image, made, parent_path, code);
  if (!parent) return nullptr;
  IsoDir* dir = nullptr;
  std::string name = path.substr(slash == std::string::npos ? 0 : slash + 1);
  *code = isofs->iso_image_add_new_dir(image, parent, name.c_str(), &dir);
  if (*code < 0) return nullptr;
  isofs->iso_node_set_permissions(reinterpret_cast<IsoNode*>(dir), 0555);
  made[path] = dir;
  return dir;
}

}  // namespace

result<void> write_config_drive(const std::string& path, const std::vector<DriveFile>& files) {
  if (auto loaded = load_libisofs(); !loaded) return loaded;
  auto failed = [](std::string message) { return Error(errc::launch_failure, std::move(message)); };
  IsoImageRef image;
  if (int code = isofs->iso_image_new(volume_label, &image.image); code < 0) return failed(iso_failure("new image", code));
  std::map<std::string, IsoDir*> dirs;
  for (const DriveFile& file : files) {
    size_t slash = file.path.rfind('/');
    int code = 0;
    IsoDir* parent = directory(image.image, dirs, slash == std::string::npos ? "" : file.path.substr(0, slash), &code);
    if (!parent) return failed(iso_failure(file.path.c_str(), code));
    // The stream owns a malloc'd copy and frees it.
    auto* bytes = static_cast<unsigned char*>(malloc(file.content.size() ? file.content.size() : 1));
    if (!bytes) return failed("config drive: out of memory");
    memcpy(bytes, file.content.data(), file.content.size());
    IsoStream* stream = nullptr;
    if (code = isofs->iso_memory_stream_new(bytes, file.content.size(), &stream); code < 0) {
      free(bytes);
      return failed(iso_failure(file.path.c_str(), code));
    }
    IsoFile* node = nullptr;
    std::string name = file.path.substr(slash == std::string::npos ? 0 : slash + 1);
    code = isofs->iso_image_add_new_file(image.image, parent, name.c_str(), stream, &node);
    if (code < 0) {
      isofs->iso_stream_unref(stream);
      return failed(iso_failure(file.path.c_str(), code));
    }
    isofs->iso_node_set_permissions(reinterpret_cast<IsoNode*>(node), 0444);
  }
  OptsRef opts;
  // Profile 1: Rock Ridge, so Linux sees the names as they are; Joliet for other readers.
  if (int code = isofs->iso_write_opts_new(&opts.opts, 1); code < 0) return failed(iso_failure("options", code));
  isofs->iso_write_opts_set_joliet(opts.opts, 1);
  SourceRef source;
  if (int code = isofs->iso_image_create_burn_source(image.image, opts.opts, &source.source); code < 0)
    return failed(iso_failure("making the volume", code));

  // Written next to its place and renamed, so a half-written drive is never attached.
  std::string partial = path + ".partial";
  int fd = open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  // A partial file left by a crash keeps its mode through open(): set it again.
  if (fd >= 0 && fchmod(fd, 0600) != 0) close(std::exchange(fd, -1));
  if (fd < 0) return failed(fmt::format("config drive: cannot create {}: {}", partial, strerror(errno)));
  unsigned char block[block_size];
  bool ok = true;
  std::string why;
  for (;;) {
    int got = source.source->read_xt(source.source, block, block_size);
    if (got == 0) {
      source.drained = true;
      break;
    }
    if (got < 0) {
      ok = false;
      why = "libisofs failed while writing the volume";
      break;
    }
    if (::write(fd, block, size_t(got)) != got) {
      ok = false;
      why = fmt::format("writing {}: {}", partial, strerror(errno));
      break;
    }
  }
  if (ok && fsync(fd) != 0) ok = false, why = fmt::format("writing {}: {}", partial, strerror(errno));
  close(fd);
  if (ok && rename(partial.c_str(), path.c_str()) != 0)
    ok = false, why = fmt::format("cannot rename {}: {}", partial, strerror(errno));
  if (!ok) {
    unlink(partial.c_str());
    return failed("config drive: " + why);
  }
  return {};
}

}  // namespace toyvm
