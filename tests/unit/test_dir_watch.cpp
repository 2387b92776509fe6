#include "core/dir_watch.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace toyvm;
namespace fs = std::filesystem;

namespace {

struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "toyvm-dir-watch-XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~ScratchDir() { fs::remove_all(path); }
};

// Runs the loop until `changes` reaches `wanted`, the watch ends or a deadline passes; `act`
// runs once the watch is set up.
int changes_seen(const std::string& dir, int wanted, std::function<void()> act) {
  asio::io_context io;
  StopSignal stop;
  int changes = 0;
  auto changed = [&] {
    if (++changes >= wanted) io.stop();
  };
  asio::co_spawn(io, watch_directory(dir, changed, stop), [&](std::exception_ptr) { io.stop(); });
  asio::steady_timer deadline(io, std::chrono::seconds(5));
  deadline.async_wait([&](auto) { io.stop(); });
  asio::post(io, act);
  io.run();
  return changes;
}

}  // namespace

TEST_CASE("a directory watch wakes on a file written and on a file renamed into the directory") {
  ScratchDir scratch;
  CHECK(changes_seen(scratch.path, 1, [&] { std::ofstream(scratch.path / "leases") << "written"; }) >= 1);
  CHECK(changes_seen(scratch.path, 1, [&] {
          std::ofstream(scratch.path / "leases.new") << "replaced";
          fs::rename(scratch.path / "leases.new", scratch.path / "leases");
        }) >= 1);
}

TEST_CASE("a directory that cannot be watched gives no wake-ups and no error") {
  CHECK(changes_seen("/nonexistent/toyvm-dir-watch", 1, [] {}) == 0);
}
