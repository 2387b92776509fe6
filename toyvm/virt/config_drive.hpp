#pragma once
// A config drive as Nova makes one: a small ISO 9660 volume labelled config-2, with Rock
// Ridge and Joliet names, holding the instance's metadata files. It carries the guest's keys
// and user data, so it is made afresh for each instance, readable by its owner only.

#include "core/error.hpp"
#include "model/metadata.hpp"

#include <string>
#include <vector>

namespace toyvm {

// Writes the volume to `path` (mode 0600, replacing what is there); launch_failure, saying why.
result<void> write_config_drive(const std::string& path, const std::vector<DriveFile>& files);

}  // namespace toyvm
