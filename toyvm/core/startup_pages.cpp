#include "core/startup_pages.hpp"

#include <spdlog/spdlog.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <malloc.h>
#include <sstream>
#include <string>
#include <sys/mman.h>

namespace toyvm {

void release_startup_pages() {
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  size_t released = 0;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, device, inode, path;
    fields >> range >> perms >> offset >> device >> inode >> path;
    // Code and constants: the mappings that are not writable. MADV_PAGEOUT loses no data in
    // any case: the relocated read-only pages (RELRO) are private copies, kept without swap.
    if (path != self || perms.size() < 2 || perms[1] == 'w') continue;
    auto dash = range.find('-');
    uintptr_t begin = std::stoull(range.substr(0, dash), nullptr, 16);
    uintptr_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT) == 0) released += end - begin;
  }
  malloc_trim(0);  // the heap's start-up garbage, too
  spdlog::debug("start-up pages released ({} KiB of mappings)", released / 1024);
}

}  // namespace toyvm
