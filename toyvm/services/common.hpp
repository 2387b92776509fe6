#pragma once
// Helpers shared by the subcommands' entry functions.

#include "clients/etcd.hpp"
#include "clients/placement.hpp"
#include "core/async.hpp"
#include "core/error.hpp"
#include "services/say.hpp"

#include <boost/asio/io_context.hpp>
#include <fmt/format.h>

#include <string_view>
#include <string>

namespace toyvm {

// "etcd at <endpoints>: <what failed>: <what etcd or gRPC said>".
inline Error etcd_error(const EtcdClient& etcd, const Error& e) {
  return Error(e.code, fmt::format("etcd at {}: {}{}{}", etcd.endpoints_text(), e.code.message(),
                                   e.detail.empty() ? "" : ": ", e.detail));
}

// Whether a failure of a step that asks both servers came from etcd rather than from Placement.
inline bool is_etcd_error(const Error& e) {
  return e == errc::etcd_unavailable || e == errc::etcd_error || e == errc::cancelled;
}

// `e` as the operator reads it: one of etcd's with the endpoints it came from, any other as it is.
inline Error with_endpoints(const EtcdClient& etcd, const Error& e) {
  return is_etcd_error(e) ? etcd_error(etcd, e) : e;
}

// Runs `task` on `io` until it ends.
inline Outcome run_until_done(asio::io_context& io, awaitable<Outcome> task) {
  Outcome outcome = ExitCode::failed;
  std::exception_ptr failure;
  asio::co_spawn(io, std::move(task), [&](std::exception_ptr e, Outcome ended) {
    failure = e;
    outcome = std::move(ended);
    io.stop();
  });
  io.run();
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      return Error(errc::cancelled, fmt::format("internal error: {}", e.what()));
    }
  }
  return outcome;
}

// The same on a fresh event loop: `make_task(io)` gives the task.
template <class MakeTask>
Outcome run_on_loop(MakeTask make_task) {
  asio::io_context io(1);
  return run_until_done(io, make_task(io));
}

}  // namespace toyvm
