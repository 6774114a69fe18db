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
  std::vector<int32_t> shares;
  for (const TypicalPod& p : pods_)
    if (p.num_gpu > 0) shares.push_back(p.gpu_milli);
  std::sort(shares.begin(), shares.end(), std::greater<>());
  shares.erase(std::unique(shares.begin(), shares.end()), shares.end());
  // More distinct shares than kMaxShares: the least common ones are left out of the measure (their
  // free share counts as fragment), which keeps the per-node work bounded.
  if (shares.size() > kMaxShares) shares.resize(kMaxShares);
  shares_ = shares;
  other_pods_.clear();
  std::vector<GpuPod> simple;
  for (const TypicalPod& p : pods_) {
    if (p.num_gpu <= 0) continue;
    auto it = std::find(shares_.begin(), shares_.end(), p.gpu_milli);
    if (it == shares_.end()) continue;
    GpuPod g{p.cpu_milli,         p.num_gpu,    static_cast<int>(it - shares_.begin()),
             p.model_constrained, p.model_mask, p.probability};
    (p.num_gpu == 1 && !p.model_constrained ? simple : other_pods_).push_back(g);
  }
  auto by_cpu = [](const GpuPod& a, const GpuPod& b) { return a.cpu_milli < b.cpu_milli; };
  std::stable_sort(other_pods_.begin(), other_pods_.end(), by_cpu);
  std::stable_sort(simple.begin(), simple.end(), by_cpu);
  // Row k: the probability per share of the simple pods among the first k in CPU order.
  cpu_steps_.clear();
  for (const GpuPod& m : simple) cpu_steps_.push_back(m.cpu_milli);
  table_.assign((simple.size() + 1) * shares_.size(), 0.0);
  for (size_t k = 1; k <= simple.size(); ++k) {
    std::copy_n(table_.begin() + static_cast<std::ptrdiff_t>((k - 1) * shares_.size()),
                shares_.size(), table_.begin() + static_cast<std::ptrdiff_t>(k * shares_.size()));
    table_[k * shares_.size() + static_cast<size_t>(simple[k - 1].share)] +=
        simple[k - 1].probability;
  }
}

double TypicalPods::Fragmentation(int model, int64_t cpu_free,
                                  std::span<const int32_t> gpu_free) const {
  // F = total - sum over the pods m that the node can host of p_m * (free share on GPUs with at
  // least gpu_milli(m) free). This runs for every node and pod of a replay: no allocation.
  // Whole free GPUs count for every share (shares are at most 1000); used-up ones for none; only
  // the partly used ones, usually few, need sorting (descending).
  std::array<int32_t, kMaxGpusPerNode> partial;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  size_t partly = 0;
  int32_t whole = 0;
  int64_t total = 0;
  for (const int32_t v : gpu_free) {
    total += v;
    if (v >= kMilliPerGpu) {
      ++whole;
    } else if (v > 0 && partly < partial.size()) {
      size_t j = partly++;
      for (; j > 0 && partial[j - 1] < v; --j) partial[j] = partial[j - 1];
      partial[j] = v;
    }
  }
  if (total == 0) return 0;
  if (model < 0) return static_cast<double>(total);  // no GPU pod can use these GPUs (see Fits)

  // One-GPU pods without a model constraint: those with enough CPU are a prefix in CPU order, and
  // table_ holds their probability per share for each prefix. For each share s (descending), one
  // merge over the partly used GPUs gives the count and the sum of the GPUs with >= s free.
  const size_t shares = shares_.size();
  const size_t prefix = static_cast<size_t>(
      std::upper_bound(cpu_steps_.begin(), cpu_steps_.end(), cpu_free) - cpu_steps_.begin());
  const double* row = table_.data() + prefix * shares;
  std::array<int32_t, kMaxShares> count_ge;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  std::array<int64_t, kMaxShares> sum_ge;    // NOLINT(cppcoreguidelines-pro-type-member-init)
  double usable = 0;
  size_t g = 0;
  int64_t running = int64_t{whole} * kMilliPerGpu;
  for (size_t s = 0; s < shares; ++s) {
    while (g < partly && partial[g] >= shares_[s]) running += partial[g++];
    count_ge[s] = whole + static_cast<int32_t>(g);
    sum_ge[s] = running;
    if (count_ge[s] > 0) usable += row[s] * static_cast<double>(running);
  }
  // The others (several GPUs, or a model list), by CPU request: the first that lacks CPU ends it.
  for (const GpuPod& m : other_pods_) {
    if (cpu_free < m.cpu_milli) break;
    if (count_ge[m.share] < m.num_gpu) continue;
    if (m.model_constrained && (m.model_mask >> model & 1U) == 0) continue;
    usable += m.probability * static_cast<double>(sum_ge[m.share]);
  }
  return static_cast<double>(total) - usable;
}

}  // namespace gpulet::placement
