#include "model/query.hpp"

#include <fmt/format.h>

#include <charconv>

namespace toyvm {
namespace {

bool is_upper_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 255) return false;
  for (char c : name) {
    if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t end = text.find(sep, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

// Splits "resources12" into ("resources", "12"): the suffix names a granular request group,
// digits (microversion 1.25) or "_" and a name (1.33). Unknown names come back whole.
std::pair<std::string_view, std::string_view> split_group_suffix(std::string_view key) {
  static constexpr std::string_view bases[] = {"root_required", "same_subtree", "group_policy",
                                               "member_of",     "resources",    "required",
                                               "in_tree",       "limit"};
  for (std::string_view base : bases) {
    if (!key.starts_with(base)) continue;
    std::string_view suffix = key.substr(base.size());
    bool digits = !suffix.empty() && suffix.find_first_not_of("0123456789") == std::string_view::npos;
    bool named = suffix.size() > 1 && suffix[0] == '_' &&
                 suffix.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789_-") == std::string_view::npos;
    if (suffix.empty() || digits || named) return {base, suffix};
  }
  return {key, {}};
}

bool parse_positive(std::string_view text, int64_t& out) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && ptr == text.data() + text.size() && out > 0;
}

void percent_encode(std::string& out, std::string_view text) {
  static constexpr char hex[] = "0123456789ABCDEF";
  for (unsigned char c : text) {
    bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '-' || c == '_' || c == '.' || c == '~' || c == ':' || c == ',' || c == '!';
    if (plain) {
      out.push_back(char(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 0xf]);
    }
  }
}

Error invalid(std::string message) { return Error(errc::invalid_argument, std::move(message)); }

}  // namespace

bool is_resource_class(std::string_view name) noexcept { return is_upper_name(name); }
bool is_trait_name(std::string_view name) noexcept { return is_upper_name(name); }

std::string format_amounts(const ResourceAmounts& amounts) {
  std::string out;
  for (auto& [rc, amount] : amounts) out += fmt::format("{}{}:{}", out.empty() ? "" : ",", rc, amount);
  return out;
}

result<ResourceAmounts> parse_resource_amounts(std::string_view text) {
  ResourceAmounts amounts;
  if (text.empty()) {
    return invalid("empty resource list (expected e.g. VCPU:1,MEMORY_MB:256)");
  }
  for (std::string_view item : split(text, ',')) {
    size_t colon = item.find(':');
    std::string_view name = item.substr(0, colon);
    int64_t amount = 0;
    if (colon == std::string_view::npos || !is_resource_class(name) ||
        !parse_positive(item.substr(colon + 1), amount)) {
      return invalid(fmt::format("bad resource '{}' (expected CLASS:AMOUNT, e.g. VCPU:1)", item));
    }
    if (!amounts.emplace(std::string(name), amount).second) {
      return invalid(fmt::format("resource class {} given twice", name));
    }
  }
  return amounts;
}

result<PlacementQuery> parse_placement_query(std::string_view text) {
  PlacementQuery query;
  if (text.empty()) {
    return invalid("empty query (expected e.g. resources=VCPU:1,MEMORY_MB:256)");
  }
  for (std::string_view param : split(text, '&')) {
    size_t eq = param.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return invalid(fmt::format("bad parameter '{}' (expected name=value)", param));
    }
    std::string_view key = param.substr(0, eq);
    std::string_view value = param.substr(eq + 1);
    auto [base, group] = split_group_suffix(key);
    if (base == "resources") {
      auto amounts = parse_resource_amounts(value);
      if (!amounts) return amounts.error();
      for (auto& [rc, amount] : *amounts) query.resources[rc] += amount;
    } else if (base == "required" || base == "root_required") {
      for (std::string_view trait : split(value.starts_with("in:") ? value.substr(3) : value, ',')) {
        if (trait.starts_with('!')) trait.remove_prefix(1);
        if (!is_trait_name(trait)) {
          return invalid(fmt::format("bad trait '{}' in {}", trait, key));
        }
      }
    } else if (base == "limit" && group.empty()) {
      int64_t limit = 0;
      if (!parse_positive(value, limit) || limit > 100000) {
        return invalid(fmt::format("bad limit '{}' (expected a positive integer)", value));
      }
      query.limit = int(limit);
    } else if (base == "member_of" || base == "in_tree" || base == "group_policy" ||
               base == "same_subtree") {
      if (value.empty()) {
        return invalid(fmt::format("empty value for {}", key));
      }
    } else {
      return invalid(fmt::format("unknown parameter '{}'", key));
    }
    query.params.emplace_back(std::string(key), std::string(value));
  }
  if (query.resources.empty()) {
    return invalid("the query names no resources (expected e.g. resources=VCPU:1,MEMORY_MB:256)");
  }
  return query;
}

std::string PlacementQuery::to_query_string(int default_limit) const {
  std::string out;
  for (auto& [key, value] : params) {
    if (!out.empty()) out.push_back('&');
    percent_encode(out, key);
    out.push_back('=');
    percent_encode(out, value);
  }
  if (limit == 0 && default_limit > 0) out += fmt::format("&limit={}", default_limit);
  return out;
}

}  // namespace toyvm
