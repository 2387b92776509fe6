#include "core/idle_pages.hpp"

#include <catch2/catch.hpp>

#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace {

// Resident kB of this process's read-only file mappings: code and constants, relocated ones too.
struct ReadOnlyFilePages {
  long clean_kb = 0;     // what may be given back
  long relocated_kb = 0;  // private copies, which must stay
};

ReadOnlyFilePages read_only_file_pages() {
  ReadOnlyFilePages out;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool counted = false;
  long rss = 0;
  while (std::getline(smaps, line)) {
    std::istringstream fields(line);
    std::string first, perms, offset, device, inode, path;
    fields >> first;
    if (first.empty()) continue;
    if (first.back() != ':') {
      fields >> perms >> offset >> device >> inode >> path;
      counted = perms.size() > 1 && perms[1] != 'w' && path.starts_with('/');
    } else if (counted && first == "Rss:") {
      fields >> rss;
    } else if (counted && first == "Anonymous:") {
      long anonymous = 0;
      fields >> anonymous;
      (anonymous > 0 ? out.relocated_kb : out.clean_kb) += rss;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("idle pages: the clean pages of the executable and its libraries are given back, relocated ones kept") {
  const ReadOnlyFilePages before = read_only_file_pages();
  REQUIRE(before.clean_kb > 1024);
  REQUIRE(before.relocated_kb > 0);

  toyvm::release_idle_pages();
  const ReadOnlyFilePages after = read_only_file_pages();
  // What ran since (reading smaps) came back; most did not.
  CHECK(after.clean_kb < before.clean_kb / 2);

  // Vtables, type information and function pointers live in relocated pages: a page put back
  // to the file's bytes would crash these.
  std::function<int(int)> twice = [](int x) { return 2 * x; };
  CHECK(twice(21) == 42);
  CHECK_THROWS_AS(throw std::runtime_error("relocated"), std::runtime_error);
}
