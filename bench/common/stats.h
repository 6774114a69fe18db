// The benchmarks' one summary of a sample: median (p50), p99 and max, by sorting a copy.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace gpulet::bench {

struct Stats {
  double p50 = 0, p99 = 0, max = 0;
  size_t n = 0;
};

inline Stats Summarize(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.n = v.size();
  s.p50 = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, static_cast<size_t>(v.size() * 0.99))];
  s.max = v.back();
  return s;
}

}  // namespace gpulet::bench
