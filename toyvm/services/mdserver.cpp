// toyvm mdserver: the cloud-init metadata service.

#include "services/common.hpp"
#include "services/services.hpp"

namespace toyvm {

int run_mdserver(const Config&) {
  return report_failure(ExitCode::failed, "mdserver: not implemented yet");
}

}  // namespace toyvm
