#pragma once
// Classifies Placement's error answers: {"errors":[{"status":409,"code":"...","detail":"..."}]}.

#include "core/error.hpp"

#include <string>
#include <string_view>

namespace toyvm {

struct PlacementError {
  errc code = errc::placement_error;
  std::string placement_code;  // e.g. "placement.concurrent_update"
  std::string detail;          // Placement's own words, for messages
};

// For a non-2xx status. 409 splits into concurrent_update (retry the same claim), capacity
// (try another candidate) and other conflicts; 404 is not_found; 5xx is unavailable.
PlacementError classify_placement_error(int status, std::string_view body);

}  // namespace toyvm
