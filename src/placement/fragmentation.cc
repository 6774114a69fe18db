#include "placement/fragmentation.h"

#include <algorithm>
#include <array>
#include <atomic>
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
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id++;
  std::vector<int32_t> shares;
  for (const TypicalPod& p : pods_)
    if (p.num_gpu > 0) shares.push_back(p.gpu_milli);
  std::sort(shares.begin(), shares.end(), std::greater<>());
  shares.erase(std::unique(shares.begin(), shares.end()), shares.end());
  // More distinct shares than kMaxShares: the least common ones are left out of the measure (their
  // free share counts as fragment), which keeps the per-node work bounded.
  if (shares.size() > kMaxShares) shares.resize(kMaxShares);
  shares_ = shares;
  gpu_pods_.clear();
  for (const TypicalPod& p : pods_) {
    if (p.num_gpu <= 0) continue;
    auto it = std::find(shares_.begin(), shares_.end(), p.gpu_milli);
    if (it == shares_.end()) continue;
    gpu_pods_.push_back(GpuPod{p.cpu_milli, p.num_gpu, static_cast<int>(it - shares_.begin()),
                               p.model_constrained, p.model_mask, p.probability});
  }
  std::stable_sort(gpu_pods_.begin(), gpu_pods_.end(),
                   [](const GpuPod& a, const GpuPod& b) { return a.cpu_milli < b.cpu_milli; });
}

double TypicalPods::Fragmentation(int model, int64_t cpu_free,
                                  std::span<const int32_t> gpu_free) const {
  // F = total - sum over the pods m that the node can host of p_m * (free share on GPUs with at
  // least gpu_milli(m) free). For each distinct share s, count and sum the GPUs with >= s free in
  // one merge over the GPUs sorted by free share, descending. (This runs for every node and pod
  // of a replay: no allocation, no zero-filling.)
  std::array<int32_t, kMaxGpusPerNode> sorted;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  const size_t n = std::min(gpu_free.size(), sorted.size());
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {  // insertion sort, descending: at most a few GPUs
    const int32_t v = gpu_free[i];
    total += v;
    size_t j = i;
    for (; j > 0 && sorted[j - 1] < v; --j) sorted[j] = sorted[j - 1];
    sorted[j] = v;
  }
  if (total == 0) return 0;
  if (model < 0) return static_cast<double>(total);  // no GPU pod can use these GPUs (see Fits)

  // The same node states come back again and again (a node's state before a placement is asked
  // for every pod until something lands on it; pods repeat the same shapes): remember the
  // answers per thread, keyed by this distribution and the sorted state.
  struct Entry {
    uint64_t owner = 0;  // 0: empty slot
    int64_t cpu_free = 0;
    std::array<int32_t, 8> gpus{};
    int32_t model = 0;
    uint32_t n = 0;
    double value = 0;
  };
  static constexpr size_t kSlots = size_t{1} << 14;
  thread_local std::vector<Entry> memo(kSlots);
  Entry* slot = nullptr;
  if (n <= 8) {
    uint64_t h = id_ * 0x9e3779b97f4a7c15ULL ^
                 static_cast<uint64_t>(cpu_free) * 0xff51afd7ed558ccdULL ^
                 static_cast<uint64_t>(model) << 56 ^ n;
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint64_t>(sorted[i])) * 0x100000001b3ULL;
    slot = &memo[(h ^ h >> 29) & (kSlots - 1)];
    if (slot->owner == id_ && slot->cpu_free == cpu_free && slot->model == model && slot->n == n &&
        std::equal(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(n),
                   slot->gpus.begin()))
      return slot->value;
  }

  std::array<int32_t, kMaxShares> count_ge;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  std::array<int64_t, kMaxShares> sum_ge;    // NOLINT(cppcoreguidelines-pro-type-member-init)
  const size_t shares = shares_.size();
  size_t g = 0;
  int64_t running = 0;
  for (size_t s = 0; s < shares; ++s) {
    while (g < n && sorted[g] >= shares_[s]) running += sorted[g++];
    count_ge[s] = static_cast<int32_t>(g);
    sum_ge[s] = running;
  }
  double usable = 0;
  // GPU pods by CPU request, ascending: the first that lacks CPU ends the walk.
  for (const GpuPod& m : gpu_pods_) {
    if (cpu_free < m.cpu_milli) break;
    if (count_ge[m.share] < m.num_gpu) continue;
    if (m.model_constrained && (m.model_mask >> model & 1U) == 0) continue;
    usable += m.probability * static_cast<double>(sum_ge[m.share]);
  }
  const double value = static_cast<double>(total) - usable;
  if (slot != nullptr) {
    slot->owner = id_;
    slot->cpu_free = cpu_free;
    slot->model = model;
    slot->n = static_cast<uint32_t>(n);
    std::copy_n(sorted.begin(), n, slot->gpus.begin());
    slot->value = value;
  }
  return value;
}

}  // namespace gpulet::placement
