// libFuzzer target: decoding every record toyvm reads from etcd, and the metadata routes.
#include "model/groups.hpp"
#include "core/base64.hpp"
#include "model/metadata.hpp"
#include "model/records.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto work = toyvm::decode_work(text)) {
    auto again = toyvm::decode_work(toyvm::encode(*work));
    if (!again || !(*again == *work)) __builtin_trap();  // whatever decodes round-trips
  }
  if (auto instance = toyvm::decode_instance(text)) {
    auto again = toyvm::decode_instance(toyvm::encode(*instance));
    if (!again || !(*again == *instance)) __builtin_trap();
  }
  if (auto host = toyvm::decode_host(text)) {
    auto again = toyvm::decode_host(toyvm::encode(*host));
    if (!again || !(*again == *host)) __builtin_trap();
  }
  (void)toyvm::decode_group_member(text);
  toyvm::GuestView guest;
  (void)toyvm::route_metadata("GET", text, &guest);
  if (auto decoded = toyvm::base64_decode(text); decoded && toyvm::base64_encode(*decoded) != text) __builtin_trap();
  return 0;
}
