#include "core/idle_pages.hpp"

#include <spdlog/spdlog.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <malloc.h>
#include <sstream>
#include <string>
#include <sys/mman.h>
#include <vector>

namespace toyvm {
namespace {

struct Mapping {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  bool writable = false;
  bool file = false;            // backed by a file: the executable or a library
  bool ours = false;            // toyvm's own executable
  bool private_copies = false;  // pages written since mapped (relocations) or swapped out
};

std::vector<Mapping> read_mappings(const std::string& self) {
  std::vector<Mapping> mappings;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  while (std::getline(smaps, line)) {
    std::istringstream fields(line);
    std::string first;
    fields >> first;
    if (first.empty()) continue;
    if (first.back() != ':') {  // "begin-end perms offset device inode path": a new mapping
      std::string perms, offset, device, inode, path;
      fields >> perms >> offset >> device >> inode >> path;
      auto dash = first.find('-');
      if (dash == std::string::npos || perms.size() < 2) continue;
      Mapping m;
      m.begin = std::stoull(first.substr(0, dash), nullptr, 16);
      m.end = std::stoull(first.substr(dash + 1), nullptr, 16);
      m.writable = perms[1] == 'w';
      m.file = path.starts_with('/');
      m.ours = path == self;
      mappings.push_back(m);
    } else if ((first == "Anonymous:" || first == "Swap:") && !mappings.empty()) {
      uint64_t kb = 0;
      fields >> kb;
      if (kb > 0) mappings.back().private_copies = true;
    }
  }
  return mappings;
}

}  // namespace

void release_idle_pages() {
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return;
  size_t paged_out = 0, unmapped = 0;
  for (const Mapping& m : read_mappings(self)) {
    if (!m.file || m.writable) continue;
    void* start = reinterpret_cast<void*>(m.begin);
    const size_t length = m.end - m.begin;
    // The executable's pages no other process maps leave memory. MADV_PAGEOUT loses no data in
    // any case: the relocated read-only pages (RELRO) are private copies, kept without swap.
    // Libraries' pages stay in the page cache, where the next process to load them finds them.
    if (m.ours && madvise(start, length, MADV_PAGEOUT) == 0) paged_out += length;
    // Pages other processes map too (other agents, a `toyvm schedule` running, any user of
    // libc or libvirt) stay in memory for them; this process lets go of its mappings of them.
    // Only where it holds no private copy: MADV_DONTNEED would put a relocated page back to
    // the file's bytes.
    if (!m.private_copies && madvise(start, length, MADV_DONTNEED) == 0) unmapped += length;
  }
  malloc_trim(0);  // the heap's free pages, too
  spdlog::debug("idle pages released ({} KiB of mappings paged out, {} KiB let go of)", paged_out / 1024,
                unmapped / 1024);
}

}  // namespace toyvm
