#include "placement/fragmentation.h"

#include <algorithm>
#include <array>
#include <map>
#include <tuple>

namespace gpulet::placement {

TypicalPods TypicalPods::FromWorkload(std::span<const Pod> pods, double coverage) {
  using Shape = std::tuple<int64_t, int32_t, int32_t, bool, uint64_t>;
  std::map<Shape, int64_t> counts;
  for (const Pod& p : pods)
    ++counts[{p.cpu_milli, p.num_gpu, p.num_gpu > 0 ? p.gpu_milli : 0,
              p.num_gpu > 0 && p.model_constrained, p.num_gpu > 0 ? p.model_mask : 0}];
  std::vector<std::pair<Shape, int64_t>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  const double needed = coverage * static_cast<double>(pods.size());
  std::vector<TypicalPod> out;
  double covered = 0;
  for (const auto& [shape, count] : sorted) {
    if (covered >= needed && !out.empty()) break;
    TypicalPod t;
    std::tie(t.cpu_milli, t.num_gpu, t.gpu_milli, t.model_constrained, t.model_mask) = shape;
    t.probability = static_cast<double>(count);
    out.push_back(t);
    covered += static_cast<double>(count);
  }
  return FromList(std::move(out));
}

TypicalPods TypicalPods::FromList(std::vector<TypicalPod> pods) {
  TypicalPods t;
  double total = 0;
  for (const TypicalPod& p : pods) total += p.probability;
  if (total > 0)
    for (TypicalPod& p : pods) p.probability /= total;
  t.pods_ = std::move(pods);
  t.Index();
  return t;
}

void TypicalPods::Index() {
  shares_.clear();
  cpu_only_probability_ = 0;
  for (const TypicalPod& p : pods_)
    if (p.num_gpu > 0) shares_.push_back(p.gpu_milli);
  std::sort(shares_.begin(), shares_.end(), std::greater<>());
  shares_.erase(std::unique(shares_.begin(), shares_.end()), shares_.end());
  share_of_pod_.assign(pods_.size(), -1);
  for (size_t i = 0; i < pods_.size(); ++i) {
    if (pods_[i].num_gpu > 0) {
      share_of_pod_[i] = static_cast<int>(
          std::find(shares_.begin(), shares_.end(), pods_[i].gpu_milli) - shares_.begin());
    } else {
      cpu_only_probability_ += pods_[i].probability;
    }
  }
}

double TypicalPods::Fragmentation(int model, int64_t cpu_free,
                                  std::span<const int32_t> gpu_free) const {
  // F = total - sum over the pods m that the node can host of p_m * (free share on GPUs with at
  // least gpu_milli(m) free). For each distinct share s, count and sum the GPUs with >= s free in
  // one merge over the GPUs sorted by free share, descending.
  std::array<int32_t, kMaxGpusPerNode> sorted{};
  const size_t n = std::min(gpu_free.size(), sorted.size());
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    sorted[i] = gpu_free[i];
    total += gpu_free[i];
  }
  if (total == 0) return 0;
  std::sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(n), std::greater<>());
  std::array<int32_t, 64> count_ge{};
  std::array<int64_t, 64> sum_ge{};
  const size_t shares = std::min(shares_.size(), count_ge.size());
  size_t g = 0;
  int64_t running = 0;
  for (size_t s = 0; s < shares; ++s) {
    while (g < n && sorted[g] >= shares_[s]) running += sorted[g++];
    count_ge[s] = static_cast<int32_t>(g);
    sum_ge[s] = running;
  }
  double usable = 0;
  for (size_t i = 0; i < pods_.size(); ++i) {
    const TypicalPod& m = pods_[i];
    const int s = share_of_pod_[i];
    if (s < 0 || static_cast<size_t>(s) >= shares) continue;  // CPU-only: all free is fragment
    if (cpu_free < m.cpu_milli) continue;
    if (model < 0 || (m.model_constrained && (m.model_mask >> model & 1U) == 0)) continue;
    if (count_ge[s] < m.num_gpu) continue;
    usable += m.probability * static_cast<double>(sum_ge[s]);
  }
  return static_cast<double>(total) - usable;
}

}  // namespace gpulet::placement
