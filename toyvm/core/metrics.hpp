#pragma once
// Prometheus metrics: counters, gauges and histograms with labels, one registry per process
// (prometheus-cpp's), written out in Prometheus' text exposition format (0.0.4). Every metric
// toyvm has is listed in metrics.cpp, with its help text and buckets; a name that is not there
// is a programming error and is ignored.

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toyvm::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

void count(std::string_view name, const Labels& labels = {}, double by = 1);
void set(std::string_view name, double value, const Labels& labels = {});
void observe(std::string_view name, double value, const Labels& labels = {});

// The sum of a counter's series: how many of its events there have been, whatever their labels.
double total(std::string_view name);

// Runs before each render, to set gauges that are read rather than kept (instances by state).
void on_render(std::function<void()> refresh);

// Every metric with at least one series, in the text format.
std::string render();

}  // namespace toyvm::metrics
