#include "virt/backend.hpp"

#include "virt/libvirt_api.hpp"

#include "model/uuid.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>


namespace toyvm {
namespace {

const LibvirtApi* api = nullptr;  // set by open_libvirt before any backend exists

std::string last_virt_error() {
  virErrorPtr error = api->virGetLastError();
  return error && error->message ? error->message : "unknown libvirt error";
}

bool last_error_is_no_domain() {
  virErrorPtr error = api->virGetLastError();
  return error && error->code == VIR_ERR_NO_DOMAIN;
}

struct DomainHandle {
  virDomainPtr ptr = nullptr;
  explicit DomainHandle(virDomainPtr p) : ptr(p) {}
  ~DomainHandle() {
    if (ptr) api->virDomainFree(ptr);
  }
  DomainHandle(const DomainHandle&) = delete;
  DomainHandle& operator=(const DomainHandle&) = delete;
};

class LibvirtBackend final : public VirtBackend {
 public:
  LibvirtBackend(virConnectPtr conn, std::string domain_type)
      : conn_(conn), domain_type_(std::move(domain_type)) {}
  ~LibvirtBackend() override { api->virConnectClose(conn_); }

  VirtResult<bool> create(const DomainSpec& spec) override {
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, spec.uuid.c_str()));
    if (!dom.ptr) {
      if (!last_error_is_no_domain()) return fail<bool>("launch_failure");
      dom.ptr = api->virDomainDefineXML(conn_, domain_xml(spec, domain_type_).c_str());
      if (!dom.ptr) return fail<bool>("launch_failure");
    }
    int active = api->virDomainIsActive(dom.ptr);
    if (active == 1) return {true, {}};
    if (active < 0 || api->virDomainCreate(dom.ptr) < 0) return fail<bool>("launch_failure");
    return {true, {}};
  }

  VirtResult<bool> start(const std::string& uuid) override {
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
    if (!dom.ptr) return fail<bool>("launch_failure");
    if (api->virDomainIsActive(dom.ptr) == 1) return {true, {}};
    if (api->virDomainCreate(dom.ptr) < 0) return fail<bool>("launch_failure");
    return {true, {}};
  }

  VirtResult<bool> stop(const std::string& uuid) override {
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
    if (!dom.ptr) return fail<bool>("invalid_data");
    if (api->virDomainIsActive(dom.ptr) != 1) return {true, {}};
    if (api->virDomainDestroy(dom.ptr) < 0) return fail<bool>("launch_failure");
    return {true, {}};
  }

  VirtResult<bool> destroy(const std::string& uuid) override {
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
    if (!dom.ptr) {
      if (last_error_is_no_domain()) return {true, {}};
      return fail<bool>("launch_failure");
    }
    if (api->virDomainIsActive(dom.ptr) == 1 && api->virDomainDestroy(dom.ptr) < 0)
      return fail<bool>("launch_failure");
    if (api->virDomainUndefine(dom.ptr) < 0 && !last_error_is_no_domain())
      return fail<bool>("launch_failure");
    return {true, {}};
  }

  VirtResult<DomainState> state(const std::string& uuid) override {
    DomainHandle dom(api->virDomainLookupByUUIDString(conn_, uuid.c_str()));
    if (!dom.ptr) {
      if (last_error_is_no_domain()) return {DomainState::absent, {}};
      return fail<DomainState>("launch_failure");
    }
    int active = api->virDomainIsActive(dom.ptr);
    if (active < 0) return fail<DomainState>("launch_failure");
    return {active == 1 ? DomainState::running : DomainState::stopped, {}};
  }

  VirtResult<std::vector<std::string>> list() override {
    virDomainPtr* domains = nullptr;
    int count = api->virConnectListAllDomains(conn_, &domains, 0);
    if (count < 0) return fail<std::vector<std::string>>("launch_failure");
    std::vector<std::string> uuids;
    char uuid[VIR_UUID_STRING_BUFLEN];
    for (int i = 0; i < count; ++i) {
      const char* name = api->virDomainGetName(domains[i]);
      if (name && api->virDomainGetUUIDString(domains[i], uuid) == 0 && domain_name(uuid) == name)
        uuids.emplace_back(uuid);
      api->virDomainFree(domains[i]);
    }
    free(domains);
    return {std::move(uuids), {}};
  }

 private:
  template <class T>
  VirtResult<T> fail(const char* reason) {
    return {T{}, VirtFailure{reason, last_virt_error()}};
  }

  virConnectPtr conn_;
  std::string domain_type_;
};

std::string xml_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '\'': out += "&apos;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace

std::string domain_name(const std::string& uuid) { return "toyvm-" + uuid; }

std::string domain_xml(const DomainSpec& spec, const std::string& domain_type) {
  return fmt::format(
      "<domain type='{type}'>\n"
      "  <name>{name}</name>\n"
      "  <uuid>{uuid}</uuid>\n"
      "  <title>{title}</title>\n"
      "  <memory unit='MiB'>{memory}</memory>\n"
      "  <vcpu>{vcpus}</vcpu>\n"
      "  <os><type arch='x86_64'>hvm</type></os>\n"
      "  <features><acpi/></features>\n"
      "  <on_poweroff>destroy</on_poweroff>\n"
      "</domain>\n",
      fmt::arg("type", xml_escape(domain_type)), fmt::arg("name", domain_name(spec.uuid)),
      fmt::arg("uuid", xml_escape(spec.uuid)), fmt::arg("title", xml_escape(spec.name)),
      fmt::arg("memory", spec.memory_mb), fmt::arg("vcpus", spec.vcpus));
}

result<std::unique_ptr<VirtBackend>> open_libvirt(const LibvirtOptions& options, std::string* detail) {
  api = load_libvirt(detail);
  if (!api) return errc::virt_error;
  virConnectPtr conn = api->virConnectOpen(options.uri.c_str());
  if (!conn) {
    if (detail) *detail = fmt::format("cannot open libvirt {}: {}", options.uri, last_virt_error());
    return errc::virt_error;
  }
  std::string type = options.domain_type;
  if (type.empty()) type = options.uri.starts_with("test:") ? "test" : "qemu";
  return std::unique_ptr<VirtBackend>(std::make_unique<LibvirtBackend>(conn, type));
}

}  // namespace toyvm
