#pragma once
// GET /metrics in Prometheus' text format, for `[compute] metrics_listen` and
// `[mdserver] metrics_listen`: off unless set, and never on the guests' metadata address.

#include "core/async.hpp"

#include <boost/asio/io_context.hpp>

#include <string>
#include <vector>

namespace toyvm {

// Why `address` may not serve metrics (not ADDRESS:PORT, or an address guests reach: the
// metadata address or one the metadata service listens on); empty when it may.
std::string metrics_address_problem(const std::string& address, const std::vector<std::string>& guest_listens);

// Serves `address` until the process ends; false (with why) when it cannot listen.
bool serve_metrics(asio::io_context& io, const std::string& address, std::string* error);

}  // namespace toyvm
