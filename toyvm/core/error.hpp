#pragma once
// toyvm's error codes: one category, so every layer can return error_code / result<T>.

#include <boost/system/error_code.hpp>
#include <boost/system/result.hpp>

#include <string>
#include <utility>

namespace toyvm {

using boost::system::error_code;
template <class T>
using result = boost::system::result<T, error_code>;

enum class errc {
  ok = 0,
  invalid_argument,       // bad user input: query, uuid, flag
  invalid_config,         // config file unreadable or malformed
  not_found,              // unknown instance, key, provider
  already_exists,         // create-only write found the key
  no_allocations_left,    // nothing fits the request
  etcd_unavailable,       // etcd did not answer
  etcd_error,             // etcd answered with an error
  placement_unavailable,  // connection refused, timeout
  placement_conflict,     // 409 other than concurrent_update
  placement_concurrent_update,  // generation moved: retry
  placement_capacity,     // claim would exceed capacity
  placement_error,        // any other Placement error answer
  corrupt_record,         // a value in etcd that does not decode
  virt_error,             // libvirt refused
  timeout,
  cancelled,
  changed,                // what a guarded write was decided on changed meanwhile
};

const boost::system::error_category& toyvm_category() noexcept;

inline error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), toyvm_category()};
}

// An error with the detail that a person needs to act on it.
struct Failure {
  error_code code;
  std::string detail;
};

// Exit codes at the edge of the program (documented in README.md).
enum class ExitCode : int {
  ok = 0,
  no_allocations = 1,   // the toy's contract: NO ALLOCATIONS LEFT
  usage = 2,            // bad flags, malformed query or uuid
  not_found = 3,        // unknown instance
  unavailable = 4,      // etcd or Placement unreachable
  failed = 5,           // anything else, including an instance in ERROR with --wait
  no_address = 6,       // --wait: the instance is ACTIVE but its guest got no address
};

ExitCode exit_code_for(const error_code& ec) noexcept;

}  // namespace toyvm

template <>
struct boost::system::is_error_code_enum<toyvm::errc> : std::true_type {};
