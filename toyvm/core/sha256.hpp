#pragma once
// SHA-256 through OpenSSL's libcrypto (uses the CPU's SHA extensions where present).

#include <memory>
#include <string>
#include <string_view>

namespace toyvm {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  std::string hex();  // ends the computation

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

std::string sha256_hex(std::string_view data);

}  // namespace toyvm
