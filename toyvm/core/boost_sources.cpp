// Boost.JSON and Boost.URL compiled into toyvm instead of loaded as shared libraries: every
// command then resolves fewer symbols at start-up and maps two libraries fewer.
#include <boost/json/src.hpp>
#include <boost/url/src.hpp>
