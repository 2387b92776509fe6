#pragma once
// Lets Catch2 print boost::system::result in assertions (it would otherwise try to stream
// the value, which most value types cannot do).

#include "core/error.hpp"

#include <boost/system/result.hpp>
#include <catch2/catch.hpp>

#include <string>

namespace Catch {
template <class T, class E>
struct StringMaker<boost::system::result<T, E>> {
  static std::string convert(const boost::system::result<T, E>& r) {
    return r.has_value() ? "a value" : "error: " + r.error().message();
  }
};
}  // namespace Catch

// What a failed result says; empty for a value (which no "contains" check matches).
template <class T>
std::string said(const toyvm::result<T>& r) {
  return r ? std::string() : r.error().message();
}
