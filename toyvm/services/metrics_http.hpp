#pragma once
// GET /metrics in Prometheus' text format, for `[compute] metrics_listen` and
// `[mdserver] metrics_listen`: off unless set, and never on the guests' metadata address.

#include "core/async.hpp"
#include "core/error.hpp"

#include <boost/asio/io_context.hpp>

#include <optional>
#include <string>
#include <vector>

namespace toyvm {

// Serves `address` (ADDRESS:PORT) until the process ends. Refuses an address guests reach (the
// metadata address, or one the metadata service listens on: `guest_listens`) as invalid_config,
// and one it cannot listen on as a plain failure.
result<void> serve_metrics(asio::io_context& io, const std::string& address,
                           const std::vector<std::string>& guest_listens);

}  // namespace toyvm
