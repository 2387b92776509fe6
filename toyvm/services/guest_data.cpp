// The guest data of `toyvm schedule`: the image reference checked for its syntax, the user
// data file read within Nova's limit, the ssh keys given inline or as OpenSSH key files.

#include "services/guest_data.hpp"

#include "model/image.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <optional>

namespace toyvm {
namespace {

// Nova's limit on user data; etcd's on a request is 1.5 MiB.
constexpr size_t max_user_data = 64 * 1024;

std::optional<std::string> read_small_file(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string data(limit + 1, '\0');
  in.read(data.data(), std::streamsize(data.size()));
  data.resize(size_t(in.gcount()));
  return data;
}

}  // namespace

result<void> read_guest_data(const ScheduleOptions& options, WorkSpec& spec) {
  // The syntax only: which schemes are allowed, and whether the image exists, is each agent's call.
  if (!options.image.empty()) {
    auto image = parse_image_ref(options.image, {"http", "https", "file"});
    if (!image) return image.error();
  }
  if (!options.image_sha256.empty() && !is_sha256_hex(options.image_sha256)) {
    return Error(errc::invalid_argument, "--image-sha256 must be 64 lowercase hex digits");
  }
  // Given read already (a member's request, through the scheduler service): checked the same.
  if (options.user_data.size() > max_user_data)
    return Error(errc::invalid_argument, fmt::format("the user data is larger than {} bytes", max_user_data));
  spec.user_data = options.user_data;
  for (const auto& [name, key] : options.named_keys) {
    if (name.empty() || name.find('\n') != std::string::npos || key.find('\n') != std::string::npos)
      return Error(errc::invalid_argument, fmt::format("bad ssh key '{}'", name.substr(0, 40)));
    spec.keys.emplace_back(name, key);
  }
  if (!options.user_data_file.empty()) {
    auto data = read_small_file(options.user_data_file, max_user_data);
    if (!data)
      return Error(errc::invalid_argument, fmt::format("cannot read user data file {}", options.user_data_file));
    if (data->size() > max_user_data)
      return Error(errc::invalid_argument,
                   fmt::format("user data file {} is larger than {} bytes", options.user_data_file, max_user_data));
    spec.user_data = std::move(*data);
  }
  for (const std::string& key : options.keys) {
    size_t eq = key.find('=');
    if (eq == 0 || eq == std::string::npos || key.find('\n') != std::string::npos) {
      return Error(errc::invalid_argument, fmt::format("bad --key '{}' (expected NAME=PUBKEY)", key.substr(0, 40)));
    }
    spec.keys.emplace_back(key.substr(0, eq), key.substr(eq + 1));
  }
  for (const std::string& file : options.key_files) {
    auto text = read_small_file(file, 16 * 1024);
    if (!text || text->size() > 16 * 1024) {
      return Error(errc::invalid_argument, fmt::format("cannot read ssh public key file {}", file));
    }
    std::string line = text->substr(0, text->find('\n'));
    // "type base64 comment": the comment names the key, else the file does.
    size_t first = line.find(' ');
    size_t second = first == std::string::npos ? first : line.find(' ', first + 1);
    if (first == std::string::npos) {
      return Error(errc::invalid_argument, fmt::format("{} is not an OpenSSH public key", file));
    }
    std::string name = second == std::string::npos ? std::filesystem::path(file).stem().string()
                                                   : line.substr(second + 1);
    spec.keys.emplace_back(name, line);
  }
  return {};
}

}  // namespace toyvm
