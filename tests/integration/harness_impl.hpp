#pragma once
#include <boost/asio/io_context.hpp>

#include <exception>
#include <optional>

namespace toyvm::test {

template <class T>
T run_sync(std::function<awaitable<T>(asio::io_context&)> make) {
  asio::io_context io(1);
  std::optional<T> value;
  std::exception_ptr failure;
  asio::co_spawn(io, make(io), [&](std::exception_ptr e, T v) {
    failure = e;
    if (!e) value.emplace(std::move(v));
  });
  io.run();
  if (failure) std::rethrow_exception(failure);
  return std::move(*value);
}

}  // namespace toyvm::test
