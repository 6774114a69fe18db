// Google Benchmark runs whose report is the median and p99 of single-iteration repetitions (the
// benchmarks that time one expensive call: a MIG apply, a Prepare).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace gpulet::bench {

inline double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// One iteration per repetition, `repetitions` of them, reported as p50 and p99 in microseconds.
inline void Percentiles(benchmark::internal::Benchmark* b, int repetitions) {
  b->Iterations(1)
      ->Repetitions(repetitions)
      ->ReportAggregatesOnly(true)
      ->Unit(benchmark::kMicrosecond)
      ->ComputeStatistics("p50", [](const std::vector<double>& v) { return Percentile(v, 0.50); })
      ->ComputeStatistics("p99", [](const std::vector<double>& v) { return Percentile(v, 0.99); });
}

}  // namespace gpulet::bench
