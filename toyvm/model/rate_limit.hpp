#pragma once
// Per-source token buckets, as Neutron's metadata proxy limits guests: each source may make
// `burst` requests at once and `rate` per second after that. Pure: the caller passes the time.

#include <chrono>
#include <string>
#include <unordered_map>

namespace toyvm {

class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  RateLimiter(double rate_per_s, double burst) : rate_(rate_per_s), burst_(burst) {}

  // True when `source` may make one more request at `now` (and takes a token).
  bool allow(const std::string& source, Clock::time_point now);

  size_t tracked() const { return buckets_.size(); }

 private:
  struct Bucket {
    double tokens;
    Clock::time_point last;
  };
  double rate_;
  double burst_;
  std::unordered_map<std::string, Bucket> buckets_;
  Clock::time_point last_prune_{};
};

}  // namespace toyvm
