#include "model/image.hpp"
#include "virt/backend.hpp"
#include "virt/libvirt_xml.hpp"

#include "catch_result.hpp"

#include <string>

using namespace toyvm;

namespace {

const std::vector<std::string> all_schemes{"http", "https", "file"};

std::string qcow2_header(uint32_t version, uint64_t size, uint64_t backing_offset = 0, uint32_t crypt = 0) {
  std::string h(104, '\0');
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) h[at + i] = char(v >> (24 - 8 * i));
  };
  auto put64 = [&](size_t at, uint64_t v) {
    put32(at, uint32_t(v >> 32));
    put32(at + 4, uint32_t(v));
  };
  h.replace(0, 4, "QFI\xfb", 4);
  put32(4, version);
  put64(8, backing_offset);
  put32(20, 16);
  put64(24, size);
  put32(32, crypt);
  return h;
}

}  // namespace

TEST_CASE("image names stay inside the image directory") {
  auto name = parse_image_ref("debian-12.qcow2", all_schemes);
  REQUIRE(name);
  CHECK(name->kind == ImageRef::Kind::name);
  CHECK(name->name == "debian-12.qcow2");
  for (const char* bad : {"../etc/passwd", "a/b", "..", ".hidden", "", "a b", "x\\y"}) {
    CHECK_FALSE(said(parse_image_ref(bad, all_schemes)).empty());
  }
}

TEST_CASE("image URLs: file paths are absolute without '..'; schemes are checked") {
  auto file = parse_image_ref("file:///var/lib/toyvm/images/x.raw", all_schemes);
  REQUIRE(file);
  CHECK(file->kind == ImageRef::Kind::file);
  CHECK(file->path == "/var/lib/toyvm/images/x.raw");
  CHECK_FALSE(parse_image_ref("file:///var/lib/toyvm/images/../../../etc/shadow", all_schemes));
  CHECK_FALSE(parse_image_ref("file:///var/lib/toyvm/images/%2e%2e/x", all_schemes));
  CHECK_FALSE(parse_image_ref("file://otherhost/x.raw", all_schemes));

  auto http = parse_image_ref("http://images.example:8080/a/b.qcow2?v=1", all_schemes);
  REQUIRE(http);
  CHECK(http->kind == ImageRef::Kind::http);
  CHECK(http->host == "images.example");
  CHECK(http->port == "8080");
  CHECK(http->target == "/a/b.qcow2?v=1");
  auto https = parse_image_ref("https://images.example/b.qcow2", all_schemes);
  REQUIRE(https);
  CHECK(https->port == "443");
  auto empty_port = parse_image_ref("http://images.example:/b.qcow2", all_schemes);
  REQUIRE(empty_port);
  CHECK(empty_port->port == "80");
  auto v6 = parse_image_ref("http://[fd00::5]:8000/b.raw", all_schemes);
  REQUIRE(v6);
  CHECK(v6->host == "[fd00::5]");  // as the Host header wants it; downloads take the brackets off
  CHECK(v6->port == "8000");

  CHECK_THAT(said(parse_image_ref("http://images.example/b.qcow2", {"https"})), Catch::Contains("not allowed"));
  CHECK_FALSE(parse_image_ref("ftp://images.example/b.qcow2", {"ftp"}));
  CHECK_FALSE(parse_image_ref("http:///nohost", all_schemes));
}

TEST_CASE("path_within compares whole path components") {
  CHECK(path_within("/srv/images", "/srv/images/a"));
  CHECK(path_within("/srv/images/", "/srv/images/a/b"));
  CHECK_FALSE(path_within("/srv/images", "/srv/images"));
  CHECK_FALSE(path_within("/srv/images", "/srv/images2/a"));
  CHECK_FALSE(path_within("/srv/images", "/etc/passwd"));
}

TEST_CASE("sha256 digests are 64 lowercase hex digits") {
  CHECK(is_sha256_hex(std::string(64, 'a')));
  CHECK_FALSE(is_sha256_hex(std::string(64, 'A')));
  CHECK_FALSE(is_sha256_hex(std::string(63, 'a')));
  CHECK_FALSE(is_sha256_hex(std::string(63, 'a') + "g"));
}

TEST_CASE("probe_disk tells raw from well-formed qcow2 and refuses the rest") {
  auto raw = probe_disk("\x55\xaa random bytes", 1 << 20);
  REQUIRE(raw);
  CHECK(raw->format == DiskFormat::raw);
  CHECK(raw->virtual_size == 1 << 20);

  auto qcow2 = probe_disk(qcow2_header(3, uint64_t(10) << 30), 200'000);
  REQUIRE(qcow2);
  CHECK(qcow2->format == DiskFormat::qcow2);
  CHECK(qcow2->virtual_size == uint64_t(10) << 30);

  CHECK(said(probe_disk("", 0)) == "the image is empty");
  CHECK_FALSE(probe_disk(qcow2_header(3, 1 << 20).substr(0, 40), 40));   // truncated
  CHECK_FALSE(probe_disk(qcow2_header(7, 1 << 20), 1 << 16));            // unknown version
  CHECK_FALSE(probe_disk(qcow2_header(3, 0), 1 << 16));                  // no size
  CHECK_THAT(said(probe_disk(qcow2_header(3, 1 << 20, 512), 1 << 16)), Catch::Contains("backing file"));
  CHECK_FALSE(probe_disk(qcow2_header(3, 1 << 20, 0, 1), 1 << 16));      // encrypted
  std::string data_file = qcow2_header(3, 1 << 20);
  data_file[79] = 4;  // incompatible_features: external data file
  CHECK_THAT(said(probe_disk(data_file, 1 << 16)), Catch::Contains("external data file"));
  std::string marked = qcow2_header(3, 1 << 20);
  marked[79] = 2;  // incompatible_features: corrupt
  CHECK_FALSE(probe_disk(marked, 1 << 16));
  CHECK(probe_disk(qcow2_header(2, 1 << 20).substr(0, 72), 1 << 16));  // version 2 ends at 72
}

TEST_CASE("an overlay copied from another host is given this host's base image, in its header's cluster") {
  // As QEMU writes one: the backing file name after the header (and its extensions).
  const std::string from = "/var/lib/a/images/0123.raw";
  std::string overlay = qcow2_header(3, 1 << 30, 0x1d0);
  overlay.resize(1 << 16, '\0');
  overlay.replace(0x1d0, from.size(), from);
  overlay[19] = char(from.size());
  auto big_endian32 = [](const std::string& h, size_t at) {
    return uint32_t(uint8_t(h[at])) << 24 | uint32_t(uint8_t(h[at + 1])) << 16 | uint32_t(uint8_t(h[at + 2])) << 8 |
           uint8_t(h[at + 3]);
  };

  const std::string to = "/srv/b/images/0123.raw";  // shorter: the old name's tail is cleared
  auto rebased = rebase_overlay_header(overlay, to);
  REQUIRE(rebased);
  CHECK(rebased->size() == overlay.size());
  CHECK(big_endian32(*rebased, 16) == to.size());
  CHECK(rebased->substr(0x1d0, from.size()) == to + std::string(from.size() - to.size(), '\0'));
  CHECK(rebased->substr(0, 16) == overlay.substr(0, 16));  // everything else as it was
  CHECK(rebased->substr(0x1d0 + from.size()) == overlay.substr(0x1d0 + from.size()));
  const std::string longer = "/a/much/longer/path/to/the/same/base/image/0123.raw";
  auto again = rebase_overlay_header(*rebased, longer);
  REQUIRE(again);
  CHECK(again->substr(0x1d0, longer.size()) == longer);
  CHECK(big_endian32(*again, 16) == longer.size());

  CHECK_THAT(said(rebase_overlay_header(overlay, std::string(1 << 16, 'x'))), Catch::Contains("no room"));
  CHECK_THAT(said(rebase_overlay_header(qcow2_header(3, 1 << 30), to)), Catch::Contains("not an overlay"));
  CHECK_THAT(said(rebase_overlay_header("\x55\xaa raw bytes", to)), Catch::Contains("not a qcow2"));
  CHECK_THAT(said(rebase_overlay_header(overlay.substr(0, 0x1d0 + 4), to)), Catch::Contains("out of bounds"));
  std::string data_file = overlay;
  data_file[79] = 4;
  CHECK_THAT(said(rebase_overlay_header(data_file, to)), Catch::Contains("external data file"));
}

TEST_CASE("an image's format is what its reference declares, never guessed from its content") {
  auto ref = [](const std::string& text) {
    auto parsed = parse_image_ref(text, {"http", "https", "file"});
    REQUIRE(parsed);
    return *parsed;
  };
  CHECK(declared_format(ref("disk.raw"), "") == DiskFormat::raw);
  CHECK(declared_format(ref("cloud.qcow2"), "") == DiskFormat::qcow2);
  CHECK(declared_format(ref("file:///images/cloud.qcow2"), "") == DiskFormat::qcow2);
  CHECK(declared_format(ref("http://mirror/images/disk.raw?sig=1"), "") == DiskFormat::raw);
  CHECK(declared_format(ref("https://mirror/jammy.img"), "") == std::nullopt);
  CHECK(declared_format(ref("ubuntu"), "") == std::nullopt);
  CHECK(declared_format(ref("cloud.qcow2"), "raw") == DiskFormat::raw);  // the user's word wins
  CHECK(declared_format(ref("ubuntu"), "qcow2") == DiskFormat::qcow2);
  CHECK(declared_format(ref("ubuntu"), "vmdk") == std::nullopt);
  CHECK(parse_disk_format("qcow2") == DiskFormat::qcow2);
  CHECK(parse_disk_format("QCOW2") == std::nullopt);
}

TEST_CASE("bzImage kernels carry HdrS at 0x202") {
  std::string kernel(1024, '\0');
  kernel.replace(0x202, 4, "HdrS");
  CHECK(is_bzimage(kernel));
  CHECK_FALSE(is_bzimage(std::string(1024, '\0')));
  CHECK_FALSE(is_bzimage("HdrS"));
}

TEST_CASE("domain XML: kernel boot, overlay disk, NIC, serial log and SMBIOS") {
  DomainSpec spec;
  spec.uuid = "7387cdc8-291c-4b02-87ce-895f460b7a80";
  spec.name = "web<1>";
  spec.vcpus = 2;
  spec.memory_mb = 256;
  spec.image.kernel = "/img/tiny/kernel";
  spec.image.initrd = "/img/tiny/initrd";
  spec.image.cmdline = "console=ttyS0 quiet";
  spec.mac = instance_mac(spec.uuid);
  LibvirtOptions options;
  options.domain_type = "qemu";
  options.instance_dir = "/var/lib/toyvm/instances";
  options.network = "default";
  options.nic_model = "e1000";
  std::string xml = domain_xml(spec, options, "/var/lib/toyvm/instances/x.qcow2");
  CHECK(xml.find("<domain type='qemu'>") != std::string::npos);
  CHECK(xml.find("<name>toyvm-7387cdc8-291c-4b02-87ce-895f460b7a80</name>") != std::string::npos);
  CHECK(xml.find("<title>web&lt;1&gt;</title>") != std::string::npos);
  CHECK(xml.find("<kernel>/img/tiny/kernel</kernel><initrd>/img/tiny/initrd</initrd>") != std::string::npos);
  CHECK(xml.find("<cmdline>console=ttyS0 quiet</cmdline>") != std::string::npos);
  CHECK(xml.find("<boot dev='hd'/>") == std::string::npos);
  CHECK(xml.find("<source file='/var/lib/toyvm/instances/x.qcow2'/>") != std::string::npos);
  CHECK(xml.find("<source network='default'/><mac address='" + spec.mac + "'/><model type='e1000'/>"
                 "<filterref filter='clean-traffic'><parameter name='CTRL_IP_LEARNING' value='dhcp'/></filterref>") !=
        std::string::npos);
  CHECK(xml.find("<source path='/var/lib/toyvm/instances/7387cdc8-291c-4b02-87ce-895f460b7a80/console.log' "
                 "append='on'/>") != std::string::npos);
  CHECK(xml.find("<entry name='product'>OpenStack Nova</entry>") != std::string::npos);
  CHECK(xml.find("<smbios mode='sysinfo'/>") != std::string::npos);
  CHECK(xml.find("<acpi/>") != std::string::npos);
  CHECK(xml.find("<metadata>") == std::string::npos);
  options.owner = "853557e9-7dc3-438c-9239-f54b9673f509";
  xml = domain_xml(spec, options, "");
  CHECK(xml.find("<metadata><toyvm:owner xmlns:toyvm='urn:toyvm:owner:1'>853557e9-7dc3-438c-9239-f54b9673f509"
                 "</toyvm:owner></metadata>") != std::string::npos);
  // Read back as libvirt gives the element (its own namespace, or none), escapes undone.
  CHECK(owner_in_metadata("<owner>853557e9-7dc3-438c-9239-f54b9673f509</owner>") == options.owner);
  CHECK(owner_in_metadata("<owner xmlns=\"urn:toyvm:owner:1\">a&amp;b</owner>") == "a&b");
  CHECK_FALSE(owner_in_metadata("<other>a</other>"));
  CHECK_FALSE(owner_in_metadata("<owner>a"));

  spec.image = BootImage{};
  options.network.clear();
  xml = domain_xml(spec, options, "");
  CHECK(xml.find("<boot dev='hd'/>") != std::string::npos);
  CHECK(xml.find("<disk") == std::string::npos);
  CHECK(xml.find("<interface") == std::string::npos);
}

TEST_CASE("instance MACs are stable, QEMU-prefixed and differ between instances") {
  std::string a = instance_mac("7387cdc8-291c-4b02-87ce-895f460b7a80");
  CHECK(a == instance_mac("7387cdc8-291c-4b02-87ce-895f460b7a80"));
  CHECK(a.size() == 17);
  CHECK(a.starts_with("52:54:00:"));
  CHECK(a != instance_mac("d578fb7c-7787-4e73-b69a-a7b3ef9bf73a"));
}
