#pragma once
// Reading toyvm's JSON values from etcd field by field (simdjson's on-demand parser): each
// reader says which fields it knows and how to read them; unknown fields are skipped, so a
// newer writer may add some. Shared by the decoders of model/records.cpp and model/requests.cpp.

#include "core/error.hpp"
#include "model/query.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toyvm::json_fields {

namespace od = simdjson::ondemand;

// Reads one JSON object field by field; the first problem is kept as the error.
class Reader {
 public:
  explicit Reader(std::string_view text) : padded_(text) {}

  template <class Fn>
  result<void> each_field(Fn&& on_field) {
    try {
      od::document doc = parser().iterate(padded_);
      od::object object = doc.get_object();
      for (auto field : object) {
        std::string_view key = field.unescaped_key();
        od::value value = field.value();
        if (!on_field(key, value)) return fail(fmt::format("bad field '{}'", key));
      }
    } catch (const simdjson::simdjson_error& e) {
      return fail(fmt::format("malformed JSON: {}", e.what()));
    }
    return {};
  }

 private:
  static od::parser& parser() {
    thread_local od::parser parser;
    return parser;
  }
  static result<void> fail(std::string message) { return Error(errc::corrupt_record, std::move(message)); }
  simdjson::padded_string padded_;
};

inline bool read_string(od::value& value, std::string& out) {
  std::string_view text;
  if (value.get_string().get(text)) return false;
  out.assign(text);
  return true;
}

inline bool read_int(od::value& value, int64_t& out) { return !value.get_int64().get(out); }

// A figure that may be unknown: null is -1.
inline bool read_known(od::value& value, int64_t& out) {
  if (value.is_null()) {
    out = -1;
    return true;
  }
  return read_int(value, out);
}

inline bool read_amounts(od::value& value, ResourceAmounts& out) {
  od::object object;
  if (value.get_object().get(object)) return false;
  for (auto field : object) {
    std::string_view rc;
    int64_t amount = 0;
    if (field.unescaped_key().get(rc) || field.value().get_int64().get(amount)) return false;
    if (!is_resource_class(rc) || amount < 0) return false;
    out[std::string(rc)] = amount;
  }
  return true;
}

template <class Enum, size_t N>
bool read_enum(od::value& value, const std::string_view (&names)[N], Enum& out) {
  std::string_view text;
  if (value.get_string().get(text)) return false;
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == text) {
      out = static_cast<Enum>(i);
      return true;
    }
  }
  return false;
}

inline result<void> require(bool ok, std::string_view what) {
  if (ok) return {};
  return Error(errc::corrupt_record, fmt::format("missing or invalid {}", what));
}

// ssh keys as [{"name": ..., "key": ...}, ...].
inline bool read_named_keys(od::value& value, std::vector<std::pair<std::string, std::string>>& out) {
  od::array keys;
  if (value.get_array().get(keys)) return false;
  for (auto item : keys) {
    od::object entry;
    if (item.get_object().get(entry)) return false;
    std::string_view name, data;
    if (entry["name"].get_string().get(name) || entry["key"].get_string().get(data)) return false;
    out.emplace_back(std::string(name), std::string(data));
  }
  return true;
}

}  // namespace toyvm::json_fields
