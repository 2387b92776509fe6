#include "core/metrics.hpp"

#include "catch_result.hpp"

using namespace toyvm;

TEST_CASE("metrics are written in Prometheus' text format: help, type, labels escaped, buckets cumulative") {
  metrics::count("toyvm_instance_failures_total", {{"reason", "image \"failure\"\n"}});
  metrics::count("toyvm_instance_failures_total", {{"reason", "image \"failure\"\n"}}, 2);
  metrics::observe("toyvm_build_seconds", 0.004);
  metrics::observe("toyvm_build_seconds", 0.7);
  metrics::observe("toyvm_build_seconds", 1000);
  metrics::count("no_such_metric");  // not declared: ignored
  std::string text = metrics::render();
  CHECK_THAT(text, Catch::Contains("# TYPE toyvm_instance_failures_total counter\n"));
  CHECK_THAT(text, Catch::Contains("toyvm_instance_failures_total{reason=\"image \\\"failure\\\"\\n\"} 3\n"));
  CHECK_THAT(text, Catch::Contains("# TYPE toyvm_build_seconds histogram\n"));
  CHECK_THAT(text, Catch::Contains("toyvm_build_seconds_bucket{le=\"0.005\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("toyvm_build_seconds_bucket{le=\"1\"} 2\n"));
  CHECK_THAT(text, Catch::Contains("toyvm_build_seconds_bucket{le=\"300\"} 2\n"));
  CHECK_THAT(text, Catch::Contains("toyvm_build_seconds_bucket{le=\"+Inf\"} 3\n"));
  CHECK_THAT(text, Catch::Contains("toyvm_build_seconds_count 3\n"));
  CHECK_THAT(text, Catch::Contains("toyvm_build_seconds_sum 1000.704\n"));
  CHECK(text.find("no_such_metric") == std::string::npos);
  CHECK(text.find("toyvm_mdserver_requests_total") == std::string::npos);  // no series, not written
}

TEST_CASE("a counter's total sums its series, whatever their labels") {
  const double before = metrics::total("toyvm_moves_total");
  metrics::count("toyvm_moves_total", {{"result", "moved"}});
  metrics::count("toyvm_moves_total", {{"result", "reverted"}}, 2);
  CHECK(metrics::total("toyvm_moves_total") == before + 3);
  CHECK(metrics::total("no_such_metric") == 0);
}
