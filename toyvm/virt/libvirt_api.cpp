#include "virt/libvirt_api.hpp"

#include <dlfcn.h>

#include <mutex>
#include <thread>

namespace toyvm {
namespace {

// libvirt prints every error to stderr unless told otherwise; toyvm reports them itself.
void silent_error_handler(void*, virErrorPtr) {}

}  // namespace

result<const LibvirtApi*> load_libvirt() {
  static LibvirtApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* handle = dlopen("libvirt.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      error = std::string("cannot load libvirt: ") + dlerror();
      return;
    }
#define TOYVM_LIBVIRT_RESOLVE(name)                                              \
  api.name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name));          \
  if (!api.name) {                                                               \
    error = "libvirt has no " #name;                                             \
    return;                                                                      \
  }
    TOYVM_LIBVIRT_FUNCTIONS(TOYVM_LIBVIRT_RESOLVE)
#undef TOYVM_LIBVIRT_RESOLVE
    api.virInitialize();
    api.virSetErrorFunc(nullptr, silent_error_handler);
    // Domain events (and the connection's keepalives) need an event loop, registered before
    // the first connection: one thread for the process runs libvirt's own.
    if (api.virEventRegisterDefaultImpl() == 0)
      std::thread([] {
        while (true) api.virEventRunDefaultImpl();
      }).detach();
  });
  if (!error.empty()) return Error(errc::virt_unavailable, error);
  return &api;
}

}  // namespace toyvm
