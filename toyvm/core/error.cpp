#include "core/error.hpp"

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
      case errc::placement_capacity: return "placement capacity exceeded";
      case errc::placement_error: return "placement error";
      case errc::corrupt_record: return "corrupt record";
      case errc::virt_error: return "libvirt error";
      case errc::timeout: return "timed out";
      case errc::cancelled: return "cancelled";
      case errc::changed: return "changed meanwhile";
    }
    return "unknown toyvm error";
  }
};

}  // namespace

const boost::system::error_category& toyvm_category() noexcept {
  static const Category category;
  return category;
}

ExitCode exit_code_for(const error_code& ec) noexcept {
  if (!ec) return ExitCode::ok;
  if (ec.category() != toyvm_category()) return ExitCode::failed;
  switch (static_cast<errc>(ec.value())) {
    case errc::no_allocations_left: return ExitCode::no_allocations;
    case errc::invalid_argument:
    case errc::invalid_config: return ExitCode::usage;
    case errc::not_found: return ExitCode::not_found;
    case errc::etcd_unavailable:
    case errc::placement_unavailable:
    case errc::timeout: return ExitCode::unavailable;
    default: return ExitCode::failed;
  }
}

}  // namespace toyvm
