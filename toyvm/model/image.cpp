#include "model/image.hpp"

#include <boost/url/parse.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

namespace toyvm {
namespace {

uint32_t big_endian32(std::string_view bytes, size_t offset) {
  uint32_t value = 0;
  for (size_t i = 0; i < 4; ++i) value = (value << 8) | uint8_t(bytes[offset + i]);
  return value;
}

uint64_t big_endian64(std::string_view bytes, size_t offset) {
  return (uint64_t(big_endian32(bytes, offset)) << 32) | big_endian32(bytes, offset + 4);
}

bool has_dot_dot(std::string_view path) {
  for (const auto& part : std::filesystem::path(path))
    if (part == "..") return true;
  return false;
}

Error refuse(std::string message) { return Error(errc::invalid_argument, std::move(message)); }

}  // namespace

result<ImageRef> parse_image_ref(std::string_view text, const std::vector<std::string>& schemes) {
  ImageRef ref;
  if (text.empty()) return refuse("empty image reference");
  if (text.find("://") == std::string_view::npos) {
    bool plain = std::all_of(text.begin(), text.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    });
    if (!plain || text.front() == '.' || text.size() > 255)
      return refuse(fmt::format("image name '{}' must be letters, digits, '.', '_' or '-', "
                                        "not starting with '.'", text));
    ref.name = text;
    return ref;
  }
  auto url = boost::urls::parse_absolute_uri(text);
  if (!url) return refuse(fmt::format("image URL '{}' is not a valid URL", text));
  std::string scheme = url->scheme();
  std::transform(scheme.begin(), scheme.end(), scheme.begin(), ::tolower);
  if (std::find(schemes.begin(), schemes.end(), scheme) == schemes.end())
    return refuse(fmt::format("image URL scheme '{}' is not allowed (allowed: {})", scheme,
                                      fmt::join(schemes, ", ")));
  if (scheme == "file") {
    ref.kind = ImageRef::Kind::file;
    ref.path = url->path();  // percent-decoded
    if (!url->host().empty() && url->host() != "localhost")
      return refuse("a file:// image URL cannot name another host");
    if (ref.path.empty() || ref.path.front() != '/' || has_dot_dot(ref.path) ||
        ref.path.find('\0') != std::string::npos)
      return refuse(fmt::format("image path '{}' must be absolute, without '..'", ref.path));
    ref.path = std::filesystem::path(ref.path).lexically_normal().string();
    return ref;
  }
  if (scheme != "http" && scheme != "https")
    return refuse(fmt::format("image URL scheme '{}' is not supported", scheme));
  ref.kind = scheme == "http" ? ImageRef::Kind::http : ImageRef::Kind::https;
  ref.url = text;
  ref.host = url->encoded_host();
  if (ref.host.empty()) return refuse(fmt::format("image URL '{}' has no host", text));
  ref.port = !url->port().empty() ? std::string(url->port()) : (scheme == "http" ? "80" : "443");
  ref.target = url->encoded_resource();
  if (ref.target.empty()) ref.target = "/";
  return ref;
}

bool path_within(std::string_view dir, std::string_view path) {
  std::string_view base = dir;
  while (base.size() > 1 && base.back() == '/') base.remove_suffix(1);
  if (base == "/") return path.starts_with('/');
  return path.size() > base.size() && path.starts_with(base) && path[base.size()] == '/';
}

bool is_sha256_hex(std::string_view text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string_view to_string(DiskFormat format) noexcept {
  return format == DiskFormat::qcow2 ? "qcow2" : "raw";
}

std::optional<DiskFormat> parse_disk_format(std::string_view text) noexcept {
  if (text == "raw") return DiskFormat::raw;
  if (text == "qcow2") return DiskFormat::qcow2;
  return std::nullopt;
}

std::optional<DiskFormat> declared_format(const ImageRef& ref, std::string_view explicit_format) {
  if (!explicit_format.empty()) return parse_disk_format(explicit_format);
  std::string_view name = ref.kind == ImageRef::Kind::name   ? std::string_view(ref.name)
                          : ref.kind == ImageRef::Kind::file ? std::string_view(ref.path)
                                                             : std::string_view(ref.target);
  name = name.substr(0, name.find_first_of("?#"));
  if (name.ends_with(".qcow2")) return DiskFormat::qcow2;
  if (name.ends_with(".raw")) return DiskFormat::raw;
  return std::nullopt;
}

result<DiskInfo> probe_disk(std::string_view header, uint64_t file_size) {
  auto corrupt = [](std::string message) { return Error(errc::corrupt_record, std::move(message)); };
  if (file_size == 0) return corrupt("the image is empty");
  if (!has_qcow2_magic(header)) return DiskInfo{DiskFormat::raw, file_size};
  // qcow2 header: version @4, backing_file_offset @8, cluster_bits @20, size @24, crypt @32.
  if (header.size() < 72) return corrupt("qcow2 header is truncated");
  uint32_t version = big_endian32(header, 4);
  uint64_t backing_offset = big_endian64(header, 8);
  uint32_t cluster_bits = big_endian32(header, 20);
  uint64_t size = big_endian64(header, 24);
  uint32_t crypt = big_endian32(header, 32);
  if (version != 2 && version != 3) return corrupt(fmt::format("qcow2 version {} is unknown", version));
  if (cluster_bits < 9 || cluster_bits > 21) return corrupt("qcow2 cluster size is invalid");
  if (size == 0 || size > (uint64_t(1) << 50)) return corrupt("qcow2 virtual size is invalid");
  if (backing_offset != 0) return corrupt("qcow2 image has a backing file; only standalone images are accepted");
  if (crypt != 0) return corrupt("qcow2 image is encrypted");
  if (version == 3) {
    // Version 3 adds incompatible_features @72. An external data file (bit 2) makes QEMU open
    // whatever host file the header names (CVE-2024-32498); bit 1 is QEMU's "corrupt" mark.
    if (header.size() < 104) return corrupt("qcow2 header is truncated");
    uint64_t incompatible = big_endian64(header, 72);
    if (incompatible & 4) return corrupt("qcow2 image has an external data file; only standalone images are accepted");
    if (incompatible & 2) return corrupt("qcow2 image is marked corrupt");
  }
  return DiskInfo{DiskFormat::qcow2, size};
}

result<std::string> rebase_overlay_header(std::string_view header, std::string_view backing) {
  auto corrupt = [](std::string message) { return Error(errc::corrupt_record, "disk overlay: " + std::move(message)); };
  if (!has_qcow2_magic(header) || header.size() < 72) return corrupt("not a qcow2 image");
  const uint32_t version = big_endian32(header, 4);
  const uint64_t offset = big_endian64(header, 8);
  const uint32_t length = big_endian32(header, 16);
  const uint32_t cluster_bits = big_endian32(header, 20);
  if (version != 2 && version != 3) return corrupt(fmt::format("qcow2 version {} is unknown", version));
  if (cluster_bits < 9 || cluster_bits > 21) return corrupt("qcow2 cluster size is invalid");
  if (version == 3 && (header.size() < 104 || (big_endian64(header, 72) & 4)))
    return corrupt("an external data file, or a truncated header");
  if (offset == 0) return corrupt("no backing file: not an overlay");
  // The name lives in the header's cluster, after the header and its extensions.
  const uint64_t room = std::min<uint64_t>(uint64_t(1) << cluster_bits, header.size());
  if (offset < 72 || offset + length > header.size()) return corrupt("its backing file name is out of bounds");
  if (backing.empty() || offset + backing.size() > room)
    return corrupt(fmt::format("no room for the backing file name '{}'", backing));
  std::string out(header);
  std::fill_n(out.begin() + offset, length, '\0');
  out.replace(offset, backing.size(), backing);
  for (int i = 0; i < 4; ++i) out[16 + i] = char((backing.size() >> (8 * (3 - i))) & 0xff);
  return out;
}

bool has_qcow2_magic(std::string_view header) { return header.starts_with(std::string_view("QFI\xfb", 4)); }

bool is_bzimage(std::string_view header) {
  return header.size() >= 0x206 && header.substr(0x202, 4) == "HdrS";
}

}  // namespace toyvm
