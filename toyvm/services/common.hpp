#pragma once
// Helpers shared by the subcommands' entry functions.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "core/async.hpp"
#include "core/error.hpp"

#include <boost/asio/io_context.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace toyvm {

// The single line a failing command prints on stderr; returns the exit code to use.
inline int report_failure(ExitCode code, const std::string& message) {
  std::fprintf(stderr, "toyvm: %s\n", message.c_str());
  return static_cast<int>(code);
}

inline int report_failure(const Error& e) { return report_failure(exit_code_for(e.code), e.message()); }
inline int report_failure(errc code, const std::string& message) { return report_failure(Error(code, message)); }

// "etcd at <endpoints>: <what failed>: <what etcd or gRPC said>".
inline int etcd_failure(const EtcdClient& etcd, const Error& e) {
  return report_failure(exit_code_for(e.code), fmt::format("etcd at {}: {}{}{}", etcd.endpoints_text(), e.code.message(),
                                                           e.detail.empty() ? "" : ": ", e.detail));
}

// Runs `task` on `io` until it ends; its value is the exit code.
inline int run_until_done(asio::io_context& io, awaitable<int> task) {
  int exit_code = static_cast<int>(ExitCode::failed);
  std::exception_ptr failure;
  asio::co_spawn(io, std::move(task), [&](std::exception_ptr e, int code) {
    failure = e;
    exit_code = code;
    io.stop();
  });
  io.run();
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      return report_failure(ExitCode::failed, fmt::format("internal error: {}", e.what()));
    }
  }
  return exit_code;
}

// The same on a fresh event loop: `make_task(io)` gives the task.
template <class MakeTask>
int run_on_loop(MakeTask make_task) {
  asio::io_context io(1);
  return run_until_done(io, make_task(io));
}

}  // namespace toyvm
