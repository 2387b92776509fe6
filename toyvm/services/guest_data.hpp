#pragma once
// What `toyvm schedule` reads for the guest from its command line and files: the image
// reference, user data and ssh keys, checked before anything is claimed.

#include "core/error.hpp"
#include "model/records.hpp"
#include "services/services.hpp"

#include <string>

namespace toyvm {

// Fills in `spec`'s user data and keys; an error saying why for anything that an
// agent could never use.
result<void> read_guest_data(const ScheduleOptions& options, WorkSpec& spec);

}  // namespace toyvm
