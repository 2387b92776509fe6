#include "core/error.hpp"

#include <boost/system/system_error.hpp>
#include <boost/throw_exception.hpp>
#include <fmt/format.h>

#include <ostream>

namespace toyvm {
namespace {

class Category final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "toyvm"; }
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::ok: return "ok";
      case errc::invalid_argument: return "invalid argument";
      case errc::invalid_config: return "invalid configuration";
      case errc::not_found: return "not found";
      case errc::already_exists: return "already exists";
      case errc::no_allocations_left: return "no allocations left";
      case errc::etcd_unavailable: return "etcd unavailable";
      case errc::etcd_error: return "etcd error";
      case errc::placement_unavailable: return "placement unavailable";
      case errc::placement_conflict: return "placement conflict";
      case errc::placement_concurrent_update: return "placement concurrent update";
      case errc::placement_consumer_changed: return "placement consumer changed meanwhile";
      case errc::placement_capacity: return "placement capacity exceeded";
      case errc::placement_error: return "placement error";
      case errc::corrupt_record: return "corrupt record";
      case errc::virt_unavailable: return "libvirt unavailable";
      case errc::launch_failure: return "launch failure";
      case errc::image_failure: return "image failure";
      case errc::network_failure: return "network failure";
      case errc::host_full: return "host full";
      case errc::no_valid_host: return "no valid host";
      case errc::timeout: return "timed out";
      case errc::cancelled: return "cancelled";
      case errc::changed: return "changed meanwhile";
      case errc::not_ready: return "not ready";
      case errc::not_reached: return "not reached";
      case errc::no_address: return "no address";
      case errc::over_quota: return "over quota";
      case errc::permission_denied: return "permission denied";
    }
    return "unknown toyvm error";
  }
};

}  // namespace

const boost::system::error_category& toyvm_category() noexcept {
  static const Category category;
  return category;
}

Error Error::doing(std::string_view what) const {
  return Error(code, fmt::format("{}: {}", what, message()));
}

std::ostream& operator<<(std::ostream& out, const Error& e) { return out << e.message(); }

void throw_exception_from_error(const Error& e, const boost::source_location& loc) {
  boost::throw_exception(boost::system::system_error(e.code, e.detail), loc);
}

std::string_view reason_code(const Error& e) noexcept {
  if (e.code.category() == toyvm_category()) {
    switch (static_cast<errc>(e.code.value())) {
      case errc::image_failure: return "image_failure";
      case errc::network_failure: return "network_failure";
      case errc::host_full: return "full_cn";
      case errc::no_valid_host: return "no_valid_host";
      default: break;
    }
  }
  return "launch_failure";
}

ExitCode exit_code_for(const error_code& ec) noexcept {
  if (!ec) return ExitCode::ok;
  if (ec.category() != toyvm_category()) return ExitCode::failed;
  switch (static_cast<errc>(ec.value())) {
    case errc::no_allocations_left: return ExitCode::no_allocations;
    case errc::invalid_argument:
    case errc::invalid_config: return ExitCode::usage;
    case errc::not_found: return ExitCode::not_found;
    case errc::no_address: return ExitCode::no_address;
    case errc::over_quota: return ExitCode::over_quota;
    case errc::etcd_unavailable:
    case errc::placement_unavailable:
    case errc::timeout: return ExitCode::unavailable;
    default: return ExitCode::failed;
  }
}

}  // namespace toyvm
