#include "core/failpoint.hpp"

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>

namespace toyvm::failpoint {

namespace {

struct Action {
  enum class Kind { throw_error, pause } kind = Kind::throw_error;
  int remaining = -1;  // throws left; -1: no limit
  std::string path;    // pause: while this exists
};

std::map<std::string, Action, std::less<>> parse(const char* text) {
  std::map<std::string, Action, std::less<>> points;
  std::string_view rest = text ? text : "";
  while (!rest.empty()) {
    size_t end = rest.find(';');
    std::string_view item = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view{} : rest.substr(end + 1);
    size_t equals = item.find('=');
    if (equals == std::string_view::npos) continue;
    std::string_view spec = item.substr(equals + 1);
    Action action;
    if (spec.starts_with("pause(") && spec.ends_with(")")) {
      action.kind = Action::Kind::pause;
      action.path = std::string(spec.substr(6, spec.size() - 7));
    } else if (size_t star = spec.find("*throw"); star != std::string_view::npos && star + 6 == spec.size()) {
      action.remaining = std::atoi(std::string(spec.substr(0, star)).c_str());
    } else if (spec != "throw") {
      spdlog::warn("TOYVM_FAILPOINTS: ignoring {}", item);
      continue;
    }
    points.emplace(std::string(item.substr(0, equals)), std::move(action));
  }
  return points;
}

// Read once; points are passed on the event loop's thread only.
std::map<std::string, Action, std::less<>>& armed() {
  static std::map<std::string, Action, std::less<>> points = parse(std::getenv("TOYVM_FAILPOINTS"));
  return points;
}

}  // namespace

awaitable<void> pass(std::string_view name) {
  auto& points = armed();
  if (points.empty()) co_return;
  auto found = points.find(name);
  if (found == points.end()) co_return;
  Action& action = found->second;
  if (action.kind == Action::Kind::throw_error) {
    if (action.remaining == 0) co_return;
    if (action.remaining > 0) --action.remaining;
    spdlog::info("failpoint {}: throwing", name);
    throw std::runtime_error(fmt::format("failpoint {}", name));
  }
  std::error_code ec;
  if (!std::filesystem::exists(action.path, ec)) co_return;
  spdlog::info("failpoint {}: paused while {} exists", name, action.path);
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (std::filesystem::exists(action.path, ec)) {
    timer.expires_after(std::chrono::milliseconds(10));
    co_await timer.async_wait(use_awaitable);
  }
  spdlog::info("failpoint {}: resumed", name);
}

}  // namespace toyvm::failpoint
