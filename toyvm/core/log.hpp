#pragma once
#include <spdlog/spdlog.h>

namespace toyvm {

// Logs go to stderr with a level; under systemd (JOURNAL_STREAM set) each line starts with
// a syslog priority prefix such as <6> so journald records the level.
void init_logging(bool verbose);

}  // namespace toyvm
