#pragma once
// What the compute agent needs from a hypervisor. Calls block: the agent runs them on its
// worker pool. Implementations: libvirt (virt/libvirt_backend.cpp) and a fake for unit tests.

#include "core/error.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace toyvm {

struct DomainSpec {
  std::string uuid;  // the instance uuid doubles as the domain uuid
  std::string name;
  int64_t vcpus = 1;
  int64_t memory_mb = 256;
  int64_t disk_gb = 0;
  std::string image;
};

enum class DomainState { absent, running, stopped };

// A failure with a reason code from design.md's taxonomy (launch_failure, ...).
struct VirtFailure {
  std::string reason;
  std::string message;
};

template <class T>
struct VirtResult {
  T value{};
  std::optional<VirtFailure> failure;
  explicit operator bool() const { return !failure; }
};

class VirtBackend {
 public:
  virtual ~VirtBackend() = default;
  // Defines and starts the domain; a domain that already exists is started if needed.
  virtual VirtResult<bool> create(const DomainSpec& spec) = 0;
  virtual VirtResult<bool> start(const std::string& uuid) = 0;
  virtual VirtResult<bool> stop(const std::string& uuid) = 0;
  // Stops and undefines; a domain that does not exist is already destroyed.
  virtual VirtResult<bool> destroy(const std::string& uuid) = 0;
  virtual VirtResult<DomainState> state(const std::string& uuid) = 0;
  // The uuids of the domains this agent manages (named toyvm-<uuid>).
  virtual VirtResult<std::vector<std::string>> list() = 0;
};

struct LibvirtOptions {
  std::string uri = "test:///default";
  std::string domain_type;  // empty: "test" for test:// URIs, "qemu" otherwise
};

result<std::unique_ptr<VirtBackend>> open_libvirt(const LibvirtOptions& options, std::string* detail);

// The domain name toyvm gives an instance, and the reverse.
std::string domain_name(const std::string& uuid);
std::string domain_xml(const DomainSpec& spec, const std::string& domain_type);

}  // namespace toyvm
