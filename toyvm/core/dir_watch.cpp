#include "core/dir_watch.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/this_coro.hpp>
#include <spdlog/spdlog.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <sys/inotify.h>

namespace toyvm {

awaitable<void> watch_directory(std::string dir, std::function<void()> changed, const StopSignal& stop) {
  int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0) co_return;
  asio::posix::stream_descriptor events(co_await asio::this_coro::executor, fd);
  if (inotify_add_watch(fd, dir.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO) < 0) {
    spdlog::debug("not watching {}: {}", dir, std::strerror(errno));
    co_return;
  }
  // The events' contents do not matter, only that there were some.
  alignas(inotify_event) std::array<char, 4096> buffer;
  while (!stop.requested()) {
    auto [ec, n] = co_await events.async_read_some(asio::buffer(buffer), asio::as_tuple(use_awaitable));
    if (ec) co_return;
    if (n > 0) changed();
  }
}

}  // namespace toyvm
