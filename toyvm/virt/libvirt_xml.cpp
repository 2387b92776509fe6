// What toyvm tells libvirt, as XML: the domain, the storage pool and the disk overlays, with
// the names and paths an instance gets; and what it reads back from libvirt's XML, a
// network's DNS addresses and a domain's owner. No libvirt call here: all of it is unit tested.

#include "virt/libvirt_xml.hpp"

#include "core/sha256.hpp"

#include <fmt/format.h>
#include <libxml/parser.h>
#include <libxml/tree.h>

#include <memory>

namespace toyvm {

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

std::string overlay_name(const std::string& uuid) { return uuid + ".qcow2"; }

std::string storage_pool_xml(const std::string& name, const std::string& dir) {
  return fmt::format("<pool type='dir'><name>{}</name><target><path>{}</path></target></pool>", xml_escape(name),
                     xml_escape(dir));
}

std::string overlay_volume_xml(const std::string& uuid, uint64_t capacity, const BootImage& image) {
  std::string backing;
  if (!image.disk.empty())
    backing = fmt::format("<backingStore><path>{}</path><format type='{}'/></backingStore>",
                          xml_escape(image.disk), to_string(image.disk_format));
  return fmt::format(
      "<volume><name>{}</name><capacity unit='bytes'>{}</capacity>"
      "<target><format type='qcow2'/><permissions><mode>0600</mode></permissions></target>{}</volume>",
      overlay_name(uuid), capacity, backing);
}

std::string domain_name(const std::string& uuid) { return "toyvm-" + uuid; }

std::string instance_path(const std::string& instance_dir, const std::string& uuid) {
  return instance_dir + "/" + uuid;
}

std::string overlay_path(const std::string& instance_dir, const std::string& uuid) {
  return instance_dir + "/" + overlay_name(uuid);
}

std::string console_log_path(const std::string& instance_dir, const std::string& uuid) {
  return instance_path(instance_dir, uuid) + "/console.log";
}

std::string config_drive_path(const std::string& instance_dir, const std::string& uuid) {
  return instance_path(instance_dir, uuid) + "/config-drive.iso";
}

namespace {

// libvirt's XML read whole by libxml2 (loaded with libvirt anyway), never searched as text.
using XmlDocument = std::unique_ptr<xmlDoc, decltype(&xmlFreeDoc)>;

XmlDocument parse_xml(std::string_view xml) {
  return {xmlReadMemory(xml.data(), int(xml.size()), nullptr, nullptr,
                        XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING),
          xmlFreeDoc};
}

bool named(const xmlNode* node, const char* name) {
  return node->type == XML_ELEMENT_NODE && xmlStrEqual(node->name, BAD_CAST name);
}

std::optional<std::string> attribute(const xmlNode* node, const char* name) {
  xmlChar* value = xmlGetProp(node, BAD_CAST name);
  if (!value) return std::nullopt;
  std::string text(reinterpret_cast<const char*>(value));
  xmlFree(value);
  return text;
}

}  // namespace

std::vector<std::string> network_dns_addresses(std::string_view xml) {
  std::vector<std::string> addresses;
  XmlDocument document = parse_xml(xml);
  const xmlNode* network = document ? xmlDocGetRootElement(document.get()) : nullptr;
  if (!network || !named(network, "network")) return addresses;
  for (const xmlNode* child = network->children; child; child = child->next) {
    if (named(child, "dns") && attribute(child, "enable") == "no") return {};
    if (!named(child, "ip") || attribute(child, "family") == "ipv6") continue;
    if (auto address = attribute(child, "address")) addresses.push_back(std::move(*address));
  }
  return addresses;
}

std::optional<std::string> owner_in_metadata(std::string_view element) {
  XmlDocument document = parse_xml(element);
  const xmlNode* owner = document ? xmlDocGetRootElement(document.get()) : nullptr;
  if (!owner || !named(owner, "owner")) return std::nullopt;
  xmlChar* text = xmlNodeGetContent(owner);
  if (!text) return std::nullopt;
  std::string name(reinterpret_cast<const char*>(text));
  xmlFree(text);
  return name;
}

std::string instance_mac(const std::string& uuid) {
  std::string digest = sha256_hex(uuid);
  return fmt::format("52:54:00:{}:{}:{}", digest.substr(0, 2), digest.substr(2, 2), digest.substr(4, 2));
}

std::string domain_xml(const DomainSpec& spec, const LibvirtOptions& options, const std::string& disk,
                       const std::string& config_drive) {
  std::string type = options.domain_type.empty() ? "qemu" : options.domain_type;
  std::string boot;
  const BootImage& image = spec.image;
  if (!image.kernel.empty()) {
    boot = fmt::format("<kernel>{}</kernel>", xml_escape(image.kernel));
    if (!image.initrd.empty()) boot += fmt::format("<initrd>{}</initrd>", xml_escape(image.initrd));
    if (!image.cmdline.empty()) boot += fmt::format("<cmdline>{}</cmdline>", xml_escape(image.cmdline));
  } else {
    boot = "<boot dev='hd'/>";
  }
  std::string devices;
  if (!disk.empty())
    devices += fmt::format(
        "    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/>"
        "<source file='{}'/><target dev='vda' bus='virtio'/></disk>\n",
        xml_escape(disk));
  // Read-only, after the root disk so that the guest still sees its root as vda.
  if (!config_drive.empty())
    devices += fmt::format(
        "    <disk type='file' device='disk'><driver name='qemu' type='raw'/>"
        "<source file='{}'/><target dev='vdb' bus='virtio'/><readonly/></disk>\n",
        xml_escape(config_drive));
  if (!spec.mac.empty() && (!options.network.empty() || !options.bridge.empty())) {
    std::string source = options.bridge.empty()
                             ? fmt::format("<interface type='network'><source network='{}'/>", xml_escape(options.network))
                             : fmt::format("<interface type='bridge'><source bridge='{}'/>", xml_escape(options.bridge));
    // The filter lets the guest send only from its own MAC and the address DHCP gave it
    // (learned by libvirt from the lease): it cannot pose as another guest.
    std::string filter;
    if (!options.guest_filter.empty())
      filter = fmt::format("<filterref filter='{}'><parameter name='CTRL_IP_LEARNING' value='dhcp'/>{}</filterref>",
                           xml_escape(options.guest_filter),
                           spec.ip.empty() ? "" : fmt::format("<parameter name='IP' value='{}'/>", xml_escape(spec.ip)));
    devices += fmt::format("    {}<mac address='{}'/><model type='{}'/>{}</interface>\n", source,
                           xml_escape(spec.mac), xml_escape(options.nic_model), filter);
  }
  if (!options.instance_dir.empty()) {
    std::string log = xml_escape(console_log_path(options.instance_dir, spec.uuid));
    devices += fmt::format("    <serial type='file'><source path='{0}' append='on'/><target port='0'/></serial>\n"
                           "    <console type='file'><source path='{0}' append='on'/><target type='serial' port='0'/></console>\n",
                           log);
  }
  // Who made the domain: agents sharing one libvirt never touch each other's.
  std::string metadata;
  if (!options.owner.empty())
    metadata = fmt::format("  <metadata><toyvm:owner xmlns:toyvm='{}'>{}</toyvm:owner></metadata>\n", owner_namespace,
                           xml_escape(options.owner));
  // SMBIOS says "OpenStack Nova": cloud-init then trusts the metadata service at 169.254.169.254.
  return fmt::format(
      "<domain type='{type}'>\n"
      "  <name>{name}</name>\n"
      "  <uuid>{uuid}</uuid>\n"
      "  <title>{title}</title>\n"
      "  <memory unit='MiB'>{memory}</memory>\n"
      "  <vcpu>{vcpus}</vcpu>\n"
      "{metadata}"
      "  <sysinfo type='smbios'><system>"
      "<entry name='manufacturer'>toyvm</entry><entry name='product'>OpenStack Nova</entry>"
      "<entry name='version'>{version}</entry><entry name='serial'>{uuid}</entry>"
      "<entry name='uuid'>{uuid}</entry><entry name='family'>Virtual Machine</entry></system></sysinfo>\n"
      "  <os><type arch='x86_64'>hvm</type>{boot}<smbios mode='sysinfo'/></os>\n"
      "  <features><acpi/><apic/></features>\n"
      "  <on_poweroff>destroy</on_poweroff>\n"
      "  <on_reboot>restart</on_reboot>\n"
      "  <on_crash>destroy</on_crash>\n"
      "  <devices>\n{devices}  </devices>\n"
      "</domain>\n",
      fmt::arg("type", xml_escape(type)), fmt::arg("name", domain_name(spec.uuid)),
      fmt::arg("uuid", xml_escape(spec.uuid)), fmt::arg("title", xml_escape(spec.name)),
      fmt::arg("memory", spec.memory_mb), fmt::arg("vcpus", spec.vcpus), fmt::arg("version", TOYVM_VERSION),
      fmt::arg("boot", boot), fmt::arg("devices", devices), fmt::arg("metadata", metadata));
}

}  // namespace toyvm
