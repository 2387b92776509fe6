#include "model/rate_limit.hpp"

#include <algorithm>

namespace toyvm {

bool RateLimiter::allow(const std::string& source, Clock::time_point now) {
  if (rate_ <= 0) return true;  // limiting off
  // Full buckets carry no information: drop them now and then so the map stays small.
  if (buckets_.size() > 4096 && now - last_prune_ > std::chrono::seconds(10)) {
    std::erase_if(buckets_, [&](const auto& entry) {
      double seconds = std::chrono::duration<double>(now - entry.second.last).count();
      return entry.second.tokens + seconds * rate_ >= burst_;
    });
    last_prune_ = now;
  }
  auto [it, inserted] = buckets_.try_emplace(source, Bucket{burst_, now});
  Bucket& bucket = it->second;
  double seconds = std::chrono::duration<double>(now - bucket.last).count();
  bucket.tokens = std::min(burst_, bucket.tokens + std::max(0.0, seconds) * rate_);
  bucket.last = now;
  if (bucket.tokens < 1.0) return false;
  bucket.tokens -= 1.0;
  return true;
}

}  // namespace toyvm
