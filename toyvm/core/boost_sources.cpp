// Boost.JSON and Boost.URL compiled into toyvm instead of loaded as shared libraries: every
// command then resolves fewer symbols at start-up and maps two libraries fewer. Asio's and
// Beast's non-template functions are compiled here once (their separate compilation mode).
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
#include <boost/beast/src.hpp>
#include <boost/json/src.hpp>
#include <boost/url/src.hpp>
