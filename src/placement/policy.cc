#include "placement/policy.h"

#include <algorithm>
#include <cmath>

namespace gpulet::placement {
namespace {

// The largest node of the paper's cluster, used to put CPU and GPU on one scale.
constexpr double kMaxSpecCpuMilli = 128000;
constexpr double kMaxSpecGpuMilli = 8000;
constexpr int64_t kMaxNodeScore = 100;

class RandomPolicy final : public Policy {
 public:
  std::string_view Name() const override { return "random"; }
  std::optional<NodeScore> Score(const Node& node, const Pod& pod) const override {
    if (!Fits(node, pod)) return std::nullopt;
    return NodeScore{0, BestFitGpus(node, pod)};
  }
};

class DotProdPolicy final : public Policy {
 public:
  std::string_view Name() const override { return "dotprod"; }
  std::optional<NodeScore> Score(const Node& node, const Pod& pod) const override {
    if (!Fits(node, pod)) return std::nullopt;
    const double cpu = static_cast<double>(node.cpu_free) / kMaxSpecCpuMilli *
                       static_cast<double>(pod.cpu_milli) / kMaxSpecCpuMilli;
    const double request = static_cast<double>(pod.GpuMilliRequest()) / kMaxSpecGpuMilli;
    std::optional<NodeScore> best;
    auto consider = [&](int64_t gpu_free, GpuSet gpus) {
      const double dot = cpu + static_cast<double>(gpu_free) / kMaxSpecGpuMilli * request;
      const double score = 1 - dot / 2;  // the smaller the product, the better
      if (!best || score > best->score) best = NodeScore{score, gpus};
    };
    const GpuSet none = 0;
    if (pod.GpuMilliRequest() < kMilliPerGpu) {  // sharing or CPU-only: each partly used GPU
      for (int i = 0; i < node.GpuCount(); ++i) {
        const int32_t f = node.gpu_free[i];
        if (f < kMilliPerGpu && f >= pod.gpu_milli)
          consider(f, pod.num_gpu > 0 ? GpuSet{1} << i : none);
      }
    }
    const int idle = node.FullyFreeGpus();
    if (pod.GpuMilliRequest() <= int64_t{idle} * kMilliPerGpu) {  // or fully free GPUs
      GpuSet gpus = 0;
      for (int i = 0, need = pod.num_gpu; i < node.GpuCount() && need > 0; ++i)
        if (node.gpu_free[i] == kMilliPerGpu) gpus |= GpuSet{1} << i, --need;
      consider(int64_t{idle} * kMilliPerGpu, gpus);
    }
    if (!best) best = NodeScore{0, BestFitGpus(node, pod)};
    return best;
  }
};

class GpuClusteringPolicy final : public Policy {
 public:
  std::string_view Name() const override { return "gpuclustering"; }
  std::optional<NodeScore> Score(const Node& node, const Pod& pod) const override {
    if (!Fits(node, pod)) return std::nullopt;
    const GpuSet gpus = BestFitGpus(node, pod);
    const int cls = pod.PodClass();
    if (cls < 0) return NodeScore{0, gpus};
    int classes = 0;
    for (int32_t n : node.pods_by_class) classes += n > 0 ? 1 : 0;
    // Within a band, the fuller node first (integer arithmetic, as published).
    const int64_t fill = kMaxNodeScore / 4 *
                         (static_cast<int64_t>(kMaxSpecGpuMilli) - node.GpuFreeMilli()) /
                         static_cast<int64_t>(kMaxSpecGpuMilli);
    int64_t band = 0;
    if (node.pods_by_class[cls] > 0) {
      band = classes == 1 ? kMaxNodeScore * 3 / 4 : kMaxNodeScore * 2 / 4;
    } else if (classes == 0) {
      band = kMaxNodeScore / 4;
    }
    return NodeScore{static_cast<double>(band + fill), gpus};
  }
};

class GpuPackingPolicy final : public Policy {
 public:
  std::string_view Name() const override { return "gpupacking"; }
  std::optional<NodeScore> Score(const Node& node, const Pod& pod) const override {
    if (!Fits(node, pod)) return std::nullopt;
    const GpuSet gpus = BestFitGpus(node, pod);
    if (pod.num_gpu <= 0 || pod.gpu_milli <= 0) return NodeScore{0, gpus};
    const int idle = node.FullyFreeGpus();
    if (idle == node.GpuCount())  // an empty node: the fewer GPUs the better
      return NodeScore{static_cast<double>(std::max<int64_t>(kMaxNodeScore / 3 - idle, idle)),
                       gpus};
    int fully_free_used = 0;
    int64_t free_percent_on_used = 0;
    for (int i = 0; i < node.GpuCount(); ++i) {
      if ((gpus >> i & 1U) == 0) continue;
      if (node.gpu_free[i] == kMilliPerGpu) ++fully_free_used;
      free_percent_on_used += int64_t{node.gpu_free[i]} * 100 / kMilliPerGpu;
    }
    if (fully_free_used > 0)  // free GPUs of a used node
      return NodeScore{static_cast<double>(std::max<int64_t>(kMaxNodeScore / 2 - fully_free_used,
                                                             kMaxNodeScore / 3)),
                       gpus};
    // An already shared GPU: the less free share it keeps, the better.
    return NodeScore{static_cast<double>(std::max<int64_t>(
                         kMaxNodeScore - free_percent_on_used / 10, kMaxNodeScore / 2)),
                     gpus};
  }
};

double Identity(double x) { return x; }

double BestFitValue(const Node& node, const Pod& pod) {
  const double cpu_left = static_cast<double>(node.cpu_free - pod.cpu_milli) / kMaxSpecCpuMilli;
  const double gpu_left =
      static_cast<double>(node.GpuFreeMilli() - pod.GpuMilliRequest()) / kMaxSpecGpuMilli;
  return (1.0 - (0.5 * cpu_left + 0.5 * gpu_left)) * static_cast<double>(kMaxNodeScore);
}

class BestFitPolicy final : public Policy {
 public:
  std::string_view Name() const override { return "bestfit"; }
  std::optional<NodeScore> Score(const Node& node, const Pod& pod) const override {
    if (!Fits(node, pod)) return std::nullopt;
    return NodeScore{BestFitValue(node, pod), BestFitGpus(node, pod)};
  }
};

class FgdPolicy final : public Policy {
 public:
  explicit FgdPolicy(const TypicalPods& typical) : typical_(typical) {}
  std::string_view Name() const override { return "fgd"; }
  std::optional<NodeScore> Score(const Node& node, const Pod& pod) const override {
    if (!Fits(node, pod)) return std::nullopt;
    NodeScore s = BestFragmentationDecrease(typical_, node, pod, Identity);
    // Decreases equal in exact arithmetic may differ in the last bits (summation order); at
    // 0.001 milli-GPU they tie, and ties are drawn at random as the scheduler does.
    s.score = std::round(s.score * 1000) / 1000;
    return s;
  }

 private:
  TypicalPods typical_;
};

class FgdBestFitPolicy final : public Policy {
 public:
  explicit FgdBestFitPolicy(const TypicalPods& typical) : typical_(typical) {}
  std::string_view Name() const override { return "fgd-bestfit"; }
  std::optional<NodeScore> Score(const Node& node, const Pod& pod) const override {
    if (!Fits(node, pod)) return std::nullopt;
    NodeScore s = BestFragmentationDecrease(typical_, node, pod, Identity);
    // The decrease counted in 0.01 milli-GPU steps; best fit (0..100, so at most half a step)
    // only orders placements whose decreases round to the same step.
    s.score = std::round(s.score * 100) + BestFitValue(node, pod) / 200;
    return s;
  }

 private:
  TypicalPods typical_;
};

}  // namespace

NodeScore BestFragmentationDecrease(const TypicalPods& typical, const Node& node, const Pod& pod,
                                    double (*key)(double)) {
  const double before = typical.Fragmentation(node);
  const int64_t cpu_after = node.cpu_free - pod.cpu_milli;
  std::array<int32_t, kMaxGpusPerNode> after{};
  const size_t n = std::min<size_t>(node.gpu_free.size(), after.size());
  std::copy_n(node.gpu_free.begin(), n, after.begin());
  const std::span<const int32_t> state(after.data(), n);
  if (pod.IsSharing()) {
    std::optional<NodeScore> best;
    for (size_t i = 0; i < n; ++i) {
      const int32_t f = node.gpu_free[i];
      if (f < pod.gpu_milli) continue;
      if (std::find(node.gpu_free.begin(), node.gpu_free.begin() + static_cast<std::ptrdiff_t>(i),
                    f) != node.gpu_free.begin() + static_cast<std::ptrdiff_t>(i))
        continue;
      after[i] = f - pod.gpu_milli;
      const double s = key(before - typical.Fragmentation(node.model, cpu_after, state));
      after[i] = f;
      if (!best || s > best->score) best = NodeScore{s, GpuSet{1} << i};
    }
    if (best) return *best;
  }
  const GpuSet gpus = BestFitGpus(node, pod);
  for (size_t i = 0; i < n; ++i)
    if (gpus >> i & 1U) after[i] -= pod.gpu_milli;
  return NodeScore{key(before - typical.Fragmentation(node.model, cpu_after, state)), gpus};
}

const std::vector<std::string>& PolicyNames() {
  static const std::vector<std::string> kNames = {
      "random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "fgd-bestfit"};
  return kNames;
}

std::unique_ptr<Policy> MakePolicy(std::string_view name, const TypicalPods& typical) {
  if (name == "random") return std::make_unique<RandomPolicy>();
  if (name == "dotprod") return std::make_unique<DotProdPolicy>();
  if (name == "gpuclustering") return std::make_unique<GpuClusteringPolicy>();
  if (name == "gpupacking") return std::make_unique<GpuPackingPolicy>();
  if (name == "bestfit") return std::make_unique<BestFitPolicy>();
  if (name == "fgd") return std::make_unique<FgdPolicy>(typical);
  if (name == "fgd-bestfit") return std::make_unique<FgdBestFitPolicy>(typical);
  return nullptr;
}

uint64_t Rng::Below(uint64_t n) {
  // Rejection keeps it unbiased; at most one retry in 2 on average (usually none).
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x = Next();
  while (x >= limit) x = Next();
  return x % n;
}

std::optional<Decision> Choose(const Cluster& cluster, const Pod& pod, const Policy& policy,
                               Rng& rng) {
  std::optional<Decision> best;
  uint64_t ties = 0;
  // A policy is a pure function of (node, pod): a node in the same state as the one scored just
  // before gets the same answer without asking again (node lists group nodes by type, and until
  // they fill up, many sit side by side in the same state).
  const Node* last = nullptr;
  std::optional<NodeScore> last_score;
  for (size_t i = 0; i < cluster.nodes.size(); ++i) {
    const Node& node = cluster.nodes[i];
    if (last == nullptr || !SameState(*last, node)) {
      last_score = policy.Score(node, pod);
      last = &node;
    }
    const std::optional<NodeScore>& s = last_score;
    if (!s) continue;
    if (!best || s->score > best->choice.score) {
      best = Decision{i, *s};
      ties = 1;
    } else if (s->score == best->choice.score && rng.Below(++ties) == 0) {
      best = Decision{i, *s};
    }
  }
  return best;
}

}  // namespace gpulet::placement
