#include "model/keys.hpp"

#include "model/uuid.hpp"

namespace toyvm {

KeyLayout::KeyLayout(std::string prefix) : prefix_(std::move(prefix)) {
  while (!prefix_.empty() && prefix_.back() == '/') prefix_.pop_back();
}

std::string KeyLayout::host(std::string_view rp) const { return hosts_prefix().append(rp); }

std::string KeyLayout::work_prefix(std::string_view rp) const {
  return work_root().append(rp).append("/");
}

std::string KeyLayout::work(std::string_view rp, std::string_view instance) const {
  return work_prefix(rp).append(instance);
}

std::string KeyLayout::instance(std::string_view uuid) const {
  return instances_prefix().append(uuid);
}

std::string KeyLayout::group_prefix(std::string_view group) const {
  return groups_root() + std::string(group) + "/";
}

std::string KeyLayout::group_member(std::string_view group, std::string_view instance) const {
  return group_prefix(group).append(instance);
}

bool is_group_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
              c == '.' || c == '-';
    if (!ok) return false;
  }
  return name != "." && name != "..";
}

namespace {

// <root><host uuid>/<instance uuid>
std::optional<KeyLayout::HostInstance> parse_host_instance(std::string_view root, std::string_view key) {
  if (!key.starts_with(root)) return std::nullopt;
  key.remove_prefix(root.size());
  size_t slash = key.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  std::string_view host = key.substr(0, slash);
  std::string_view instance = key.substr(slash + 1);
  if (!is_uuid(host) || !is_uuid(instance)) return std::nullopt;
  return KeyLayout::HostInstance{std::string(host), std::string(instance)};
}

}  // namespace

std::optional<KeyLayout::HostInstance> KeyLayout::parse_work(std::string_view key) const {
  return parse_host_instance(work_root(), key);
}

std::optional<KeyLayout::HostInstance> KeyLayout::parse_domain(std::string_view key) const {
  return parse_host_instance(domains_root(), key);
}

std::optional<KeyLayout::GroupInstance> KeyLayout::parse_group_member(std::string_view key) const {
  const std::string root = groups_root();
  if (!key.starts_with(root)) return std::nullopt;
  key.remove_prefix(root.size());
  const size_t slash = key.find('/');
  if (slash == 0 || slash == std::string_view::npos || !is_uuid(key.substr(slash + 1))) return std::nullopt;
  return GroupInstance{std::string(key.substr(0, slash)), std::string(key.substr(slash + 1))};
}

std::vector<KeyLayout::Range> KeyLayout::instance_keys(std::string_view host, std::string_view uuid,
                                                       std::string_view group, std::string_view project) const {
  std::vector<Range> keys{{work(host, uuid), {}},
                          {instance(uuid), {}},
                          {project_instance(project, uuid), {}},
                          {console_prefix(project, uuid), prefix_range_end(console_prefix(project, uuid))},
                          {usage(uuid), {}},
                          {move(uuid), {}}};
  if (!group.empty()) keys.push_back({group_member(group, uuid), {}});
  return keys;
}

std::optional<std::string> KeyLayout::leaf(std::string_view key, std::string_view prefix) const {
  if (!key.starts_with(prefix)) return std::nullopt;
  key.remove_prefix(prefix.size());
  if (key.empty() || key.find('/') != std::string_view::npos) return std::nullopt;
  return std::string(key);
}

std::string prefix_range_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = char(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

}  // namespace toyvm
