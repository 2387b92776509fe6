#pragma once
// Image references and what the first bytes of an image file say about it. Pure: the agent's
// image store (virt/images.hpp) does the reading, fetching and caching.

#include "core/error.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toyvm {

// An image reference: a name in the image directory, or a URL.
struct ImageRef {
  enum class Kind { name, file, http, https };
  Kind kind = Kind::name;
  std::string name;  // kind name: the entry in the image directory
  std::string path;  // kind file: the absolute, normalised path
  std::string url;   // kind http/https: the URL as given
  std::string host, port, target;  // kind http/https
};

// Parses a reference; URL schemes not in `schemes` are refused, and neither a name nor a
// file path may contain ".." or, for names, a "/" (a reference cannot leave the image dir).
result<ImageRef> parse_image_ref(std::string_view text, const std::vector<std::string>& schemes);

// True when `path` lies inside `dir` (both absolute and normalised, symlinks resolved by the caller).
bool path_within(std::string_view dir, std::string_view path);

bool is_sha256_hex(std::string_view text);

enum class DiskFormat { raw, qcow2 };

struct DiskInfo {
  DiskFormat format = DiskFormat::raw;
  uint64_t virtual_size = 0;  // bytes the guest sees
};

std::string_view to_string(DiskFormat format) noexcept;
// "raw" or "qcow2"; nullopt for anything else.
std::optional<DiskFormat> parse_disk_format(std::string_view text) noexcept;

// The format a reference declares: `explicit_format` (schedule --image-format) if given, else
// its file name's extension (.qcow2, .raw); nullopt when neither says. A raw image is never
// guessed to be qcow2: its content is the guest's to write, header included.
std::optional<DiskFormat> declared_format(const ImageRef& ref, std::string_view explicit_format);

// What a disk image is, from its first 512 bytes (or fewer, for a short file) and its size.
// A qcow2 image must be plain: no backing file (it could name any file on the host) and no
// encryption; anything that claims to be qcow2 but is not well-formed is corrupt.
result<DiskInfo> probe_disk(std::string_view header, uint64_t file_size);

// A disk overlay copied from another host names its base image as that host has it: the
// overlay's first bytes (at least through its backing file name; reading its first cluster
// does) with the backing file name replaced by `backing`, the base as this host has it.
// corrupt_record when they are not those of a plain qcow2 overlay, or the name does not fit
// in the header's cluster.
result<std::string> rebase_overlay_header(std::string_view header, std::string_view backing);

// The first bytes of a qcow2 image ("QFI\xfb").
bool has_qcow2_magic(std::string_view header);

// A Linux kernel in the x86 boot protocol's format (bzImage: "HdrS" at 0x202).
bool is_bzimage(std::string_view header);

}  // namespace toyvm
