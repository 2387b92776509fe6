#pragma once
// toyvm's one error type: a code from one category, for decisions and the exit code, and the
// detail a person needs to act on it (the field that is wrong, what a server said in its own
// words). Every layer returns result<T>.

#include <boost/system/error_code.hpp>
#include <boost/system/result.hpp>

#include <iosfwd>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace toyvm {

using boost::system::error_code;

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
  placement_concurrent_update,  // a provider's generation moved: retry
  placement_consumer_changed,   // the consumer's generation moved: read it again
  placement_capacity,     // claim would exceed capacity
  placement_error,        // any other Placement error answer
  corrupt_record,         // a value in etcd that does not decode
  virt_unavailable,       // the connection to libvirt is lost: says nothing about the instance
  launch_failure,         // libvirt refused to make, start or stop a domain
  image_failure,          // the image cannot be fetched or is not what it says
  network_failure,        // the guests' network is missing or will not start
  host_full,              // the host runs as many instances as it may
  no_valid_host,          // the host may not take the instance (its group's policy)
  timeout,
  cancelled,
  changed,                // what a guarded write was decided on changed meanwhile
  not_ready,              // refused for now by a peer that may take it a moment later
  not_reached,            // a wait ended (timed out, or the instance went elsewhere) before what was asked
  no_address,             // the guest is ACTIVE but got no address
  over_quota,             // the request would take its project above its quota
  permission_denied,      // etcd refused: the caller's credentials do not reach that
};

const boost::system::error_category& toyvm_category() noexcept;

inline error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), toyvm_category()};
}

}  // namespace toyvm

template <>
struct boost::system::is_error_code_enum<toyvm::errc> : std::true_type {};

namespace toyvm {

template <class E>
concept ErrorCodeEnum = boost::system::is_error_code_enum<E>::value;

struct Error {
  error_code code;
  std::string detail;  // empty: the code says it all

  Error() = default;
  Error(error_code code, std::string detail = {}) : code(code), detail(std::move(detail)) {}
  template <ErrorCodeEnum E>
  Error(E code, std::string detail = {}) : code(code), detail(std::move(detail)) {}

  // The detail when there is one, else what the code means.
  std::string message() const { return detail.empty() ? code.message() : detail; }
  // The same error, its detail prefixed with what was being done: "reading x: <detail>".
  Error doing(std::string_view what) const;

  // No conversion to bool: result<bool> could not tell an Error from a value then. Ask `code`.
  friend bool operator==(const Error& e, const error_code& code) noexcept { return e.code == code; }
  template <ErrorCodeEnum E>
  friend bool operator==(const Error& e, E code) noexcept { return e.code == code; }
};

std::ostream& operator<<(std::ostream& out, const Error& e);

// What result<T>::value() throws (found by argument-dependent lookup).
[[noreturn]] void throw_exception_from_error(const Error& e, const boost::source_location& loc);

template <class T>
using result = boost::system::result<T, Error>;

// The reason code an ERROR record carries for a failure (CIAO's: launch_failure, full_cn, ...).
std::string_view reason_code(const Error& e) noexcept;

// Exit codes at the edge of the program (documented in README.md).
enum class ExitCode : int {
  ok = 0,
  no_allocations = 1,   // the toy's contract: NO ALLOCATIONS LEFT
  discrepancies = 1,    // audit: not everything it found is fixed
  usage = 2,            // bad flags, malformed query or uuid
  not_found = 3,        // unknown instance
  unavailable = 4,      // etcd or Placement unreachable
  failed = 5,           // anything else, including an instance in ERROR with --wait
  no_address = 6,       // --wait: the instance is ACTIVE but its guest got no address
  over_quota = 7,       // the request would take its project above its quota
};

ExitCode exit_code_for(const error_code& ec) noexcept;

}  // namespace toyvm
