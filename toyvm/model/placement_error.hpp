#pragma once
// Classifies Placement's error answers: {"errors":[{"status":409,"code":"...","detail":"..."}]}.

#include "core/error.hpp"

#include <string>
#include <string_view>

namespace toyvm {

// For a non-2xx status; the detail is Placement's own words. 409 splits into a provider's
// generation moving (retry the same claim), a consumer's (read it again), capacity (try
// another candidate) and other conflicts; 404 is not_found; 5xx is unavailable.
Error classify_placement_error(int status, std::string_view body);

// The trait a refused query named that Placement has never heard of ("No such trait(s):
// NAME."; Placement names the first it meets), or empty for any other refusal.
std::string unknown_trait(const Error& refusal);

}  // namespace toyvm
