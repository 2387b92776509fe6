#pragma once
// An instance's usage from two samples of its domain taken `window_s` apart: CPU time is a
// counter, so its share of the instance's vCPUs needs two.

#include "model/domain.hpp"
#include "model/records.hpp"

namespace toyvm {

InstanceUsage usage_between(const DomainUsage& first, const DomainUsage& second, double window_s);

}  // namespace toyvm
