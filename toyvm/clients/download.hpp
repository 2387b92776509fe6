#pragma once
// Streams one HTTP or HTTPS GET into a file descriptor, hashing as it goes, with a size
// limit and an idle timeout. HTTPS verifies the server against the system's CAs (or a CA
// file) and its host name.

#include "core/async.hpp"

#include <chrono>
#include <cstdint>
#include <string>

namespace toyvm {

struct DownloadRequest {
  bool https = false;
  std::string host, port, target;
  uint64_t max_bytes = 0;
  std::chrono::milliseconds idle_timeout{30'000};
  std::string ca_file;  // empty: the system's CA store
};

struct DownloadResult {
  std::string error;  // empty on success
  uint64_t bytes = 0;
  std::string sha256;
};

awaitable<DownloadResult> download_to_fd(asio::any_io_executor executor, DownloadRequest request, int fd);

}  // namespace toyvm
