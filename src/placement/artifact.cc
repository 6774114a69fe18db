#include "placement/artifact.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

namespace gpulet::placement {
namespace {

// The largest node of the paper's cluster (the artifact's MaxSpecCpu, MaxSpecGpu).
constexpr double kMaxSpecCpu = 128000;
constexpr double kMaxSpecGpu = 8000;
constexpr int64_t kMaxScore = 100;

// A shape as the artifact keys it: CPU, per-GPU share, GPU count, model list text.
using ArtifactShape = std::tuple<int64_t, int32_t, int32_t, std::string>;

ArtifactShape ShapeOf(const Pod& p) {
  return {p.cpu_milli, p.num_gpu > 0 ? p.gpu_milli : 0, p.num_gpu,
          p.num_gpu > 0 ? p.gpu_spec : std::string()};
}

// A sharing pod's GPU on a node: the best-fitting one (least free share that is enough, lowest
// index on ties); a whole-GPU pod: the lowest-indexed free GPUs (BestFitGpus does both).
GpuSet BestFitOrExclusive(const Node& node, const Pod& pod) { return BestFitGpus(node, pod); }

class Random final : public ArtifactPolicy {
 public:
  std::string_view Name() const override { return "random"; }
  // The plugin gives 100 to one node drawn uniformly among the feasible ones and 0 to the rest:
  // the same distribution as equal scores drawn by selectHost.
  double Score(const Node&, const Pod&) const override { return 0; }
  bool DrawsNode() const override { return true; }
  GpuSet Gpus(const Node& node, const Pod& pod, Rng& rng) const override {
    if (!pod.IsSharing()) return BestFitOrExclusive(node, pod);
    int chosen = -1;
    uint64_t seen = 0;
    for (int i = 0; i < node.GpuCount(); ++i)
      if (node.gpu_free[i] >= pod.gpu_milli && rng.Below(++seen) == 0) chosen = i;
    return chosen < 0 ? 0 : GpuSet{1} << chosen;
  }
};

class DotProd final : public ArtifactPolicy {
 public:
  std::string_view Name() const override { return "dotprod"; }
  // Node (CPU left, GPU left over all GPUs) and pod (CPU, GPU request), both divided by the
  // largest node; score = 100 * (1 - dot / 2), truncated ("merge" dimensions, "max" norm).
  double Score(const Node& node, const Pod& pod) const override {
    double dot = static_cast<double>(node.cpu_free) / kMaxSpecCpu *
                 (static_cast<double>(pod.cpu_milli) / kMaxSpecCpu);
    dot += static_cast<double>(node.GpuFreeMilli()) / kMaxSpecGpu *
           (static_cast<double>(pod.GpuMilliRequest()) / kMaxSpecGpu);
    dot /= 2;
    return static_cast<double>(static_cast<int64_t>(static_cast<double>(kMaxScore) * (1 - dot)));
  }
  GpuSet Gpus(const Node& node, const Pod& pod, Rng&) const override {
    return BestFitOrExclusive(node, pod);
  }
};

class GpuClustering final : public ArtifactPolicy {
 public:
  std::string_view Name() const override { return "gpuclustering"; }
  double Score(const Node& node, const Pod& pod) const override {
    const int cls = pod.PodClass();
    if (cls < 0) return 0;
    int classes = 0;
    for (int32_t n : node.pods_by_class) classes += n > 0 ? 1 : 0;
    const int64_t fill = kMaxScore / 4 * (static_cast<int64_t>(kMaxSpecGpu) - node.GpuFreeMilli()) /
                         static_cast<int64_t>(kMaxSpecGpu);
    int64_t band = 0;
    if (node.pods_by_class[cls] > 0)
      band = classes == 1 ? kMaxScore * 3 / 4 : kMaxScore * 2 / 4;
    else if (classes == 0)
      band = kMaxScore / 4;
    return static_cast<double>(fill + band);
  }
  GpuSet Gpus(const Node& node, const Pod& pod, Rng&) const override {
    return BestFitOrExclusive(node, pod);
  }
};

class GpuPacking final : public ArtifactPolicy {
 public:
  std::string_view Name() const override { return "gpupacking"; }
  double Score(const Node& node, const Pod& pod) const override {
    if (pod.num_gpu <= 0 || pod.gpu_milli <= 0) return 0;
    const int idle = node.FullyFreeGpus();
    if (idle == node.GpuCount())  // an empty node
      return static_cast<double>(std::max<int64_t>(kMaxScore / 3 - idle, idle));
    // The GPUs the pod would take, least free first (a stable sort of the indices).
    std::array<int, kMaxGpusPerNode> order{};
    const int n = std::min(node.GpuCount(), kMaxGpusPerNode);
    std::iota(order.begin(), order.begin() + n, 0);
    std::stable_sort(order.begin(), order.begin() + n,
                     [&](int a, int b) { return node.gpu_free[a] < node.gpu_free[b]; });
    int need = pod.num_gpu, fully_free_used = 0;
    int64_t free_percent = 0;
    for (int k = 0; k < n && need > 0; ++k) {
      const int32_t f = node.gpu_free[order[k]];
      if (f < pod.gpu_milli) continue;
      --need;
      if (f == kMilliPerGpu) ++fully_free_used;
      free_percent += int64_t{f} * 100 / kMilliPerGpu;
    }
    if (fully_free_used > 0)
      return static_cast<double>(std::max<int64_t>(kMaxScore / 2 - fully_free_used, kMaxScore / 3));
    return static_cast<double>(std::max<int64_t>(kMaxScore - free_percent / 10, kMaxScore / 2));
  }
  GpuSet Gpus(const Node& node, const Pod& pod, Rng&) const override {
    return BestFitOrExclusive(node, pod);
  }
};

class BestFit final : public ArtifactPolicy {
 public:
  std::string_view Name() const override { return "bestfit"; }
  double Score(const Node& node, const Pod& pod) const override {
    double left = static_cast<double>(node.cpu_free - pod.cpu_milli) / kMaxSpecCpu * 0.5;
    left += static_cast<double>(node.GpuFreeMilli() - pod.GpuMilliRequest()) / kMaxSpecGpu * 0.5;
    return static_cast<double>(static_cast<int64_t>((1.0 - left) * static_cast<double>(kMaxScore)));
  }
  bool Normalized() const override { return true; }
  GpuSet Gpus(const Node& node, const Pod& pod, Rng&) const override {
    return BestFitOrExclusive(node, pod);
  }
};

double FgdKey(double decrease_milli) { return static_cast<double>(FgdScore(decrease_milli)); }

class Fgd final : public ArtifactPolicy {
 public:
  explicit Fgd(const TypicalPods& typical) : typical_(typical) {}
  std::string_view Name() const override { return "fgd"; }
  // A sharing pod tries every GPU with enough free share and keeps the first with the highest
  // integer score; other pods take the lowest-indexed free GPUs.
  double Score(const Node& node, const Pod& pod) const override {
    return BestFragmentationDecrease(typical_, node, pod, FgdKey).score;
  }
  GpuSet Gpus(const Node& node, const Pod& pod, Rng&) const override {
    return BestFragmentationDecrease(typical_, node, pod, FgdKey).gpus;
  }

 private:
  TypicalPods typical_;
};

// Ours, with its own (continuous) score, run under the artifact's protocol.
class Literal final : public ArtifactPolicy {
 public:
  explicit Literal(std::unique_ptr<Policy> policy) : policy_(std::move(policy)) {}
  std::string_view Name() const override { return policy_->Name(); }
  double Score(const Node& node, const Pod& pod) const override {
    return policy_->Score(node, pod).value_or(NodeScore{}).score;
  }
  GpuSet Gpus(const Node& node, const Pod& pod, Rng&) const override {
    return policy_->Score(node, pod).value_or(NodeScore{}).gpus;
  }

 private:
  std::unique_ptr<Policy> policy_;
};

}  // namespace

TypicalPods ArtifactTypicalPods(std::span<const Pod> pods, double coverage) {
  std::map<ArtifactShape, std::pair<int64_t, const Pod*>> counts;
  for (const Pod& p : pods) {
    auto [it, added] = counts.try_emplace(ShapeOf(p), 0, &p);
    ++it->second.first;
  }
  std::vector<std::pair<ArtifactShape, std::pair<int64_t, const Pod*>>> sorted(counts.begin(),
                                                                               counts.end());
  // Most frequent first; equally frequent shapes in descending (CPU, share, count, model list).
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    if (a.second.first != b.second.first) return a.second.first > b.second.first;
    return a.first > b.first;
  });
  const double total = static_cast<double>(pods.size());
  const double needed = coverage * 100 * total / 100;
  std::vector<TypicalPod> out;
  double covered = 0;
  for (const auto& [shape, entry] : sorted) {
    if (covered >= needed) break;
    const Pod& p = *entry.second;
    TypicalPod t;
    t.cpu_milli = p.cpu_milli;
    t.num_gpu = p.num_gpu;
    t.gpu_milli = p.num_gpu > 0 ? p.gpu_milli : 0;
    t.model_constrained = p.num_gpu > 0 && p.model_constrained;
    t.model_mask = p.num_gpu > 0 ? p.model_mask : 0;
    t.probability = static_cast<double>(entry.first);
    out.push_back(t);
    covered += static_cast<double>(entry.first);
  }
  return TypicalPods::FromList(std::move(out));
}

std::vector<Pod> ArtifactArrivals(std::span<const Pod> trace, int64_t capacity_milli, double load,
                                  uint64_t seed) {
  Rng rng(seed);
  std::vector<Pod> out(trace.begin(), trace.end());
  for (size_t i = out.size(); i > 1; --i) std::swap(out[i - 1], out[rng.Below(i)]);
  int64_t total = 0;
  for (const Pod& p : out) total += p.GpuMilliRequest();
  const double target = load * static_cast<double>(capacity_milli);
  if (static_cast<double>(total) > target) {
    // Random pods removed until the request is within the target.
    while (!out.empty() && static_cast<double>(total) > target) {
      const size_t i = rng.Below(out.size());
      total -= out[i].GpuMilliRequest();
      out.erase(out.begin() + static_cast<std::ptrdiff_t>(i));
    }
  } else if (!trace.empty() && static_cast<double>(total) < target) {
    // Pods drawn from the trace (name order) and appended; the first draw whose per-GPU share
    // would pass the target ends it (the artifact compares the share of one GPU, not the pod's
    // whole request, so a multi-GPU pod can still go past the target).
    for (;;) {
      const Pod& p = trace[rng.Below(trace.size())];
      if (static_cast<double>(total + p.gpu_milli) > target) break;
      total += p.GpuMilliRequest();
      out.push_back(p);
    }
  }
  return out;
}

std::unique_ptr<ArtifactPolicy> MakeArtifactPolicy(std::string_view name,
                                                   const TypicalPods& typical) {
  if (name == "random") return std::make_unique<Random>();
  if (name == "dotprod") return std::make_unique<DotProd>();
  if (name == "gpuclustering") return std::make_unique<GpuClustering>();
  if (name == "gpupacking") return std::make_unique<GpuPacking>();
  if (name == "bestfit") return std::make_unique<BestFit>();
  if (name == "fgd") return std::make_unique<Fgd>(typical);
  if (std::unique_ptr<Policy> p = MakePolicy(name, typical))
    return std::make_unique<Literal>(std::move(p));
  return nullptr;
}

int64_t FgdScore(double decrease_milli) {
  const double sigmoid = 1.0 / (1.0 + std::exp(-(decrease_milli / 1000)));
  return static_cast<int64_t>(sigmoid * static_cast<double>(kMaxScore));
}

int64_t NormalizeScore(int64_t score, int64_t lowest, int64_t highest) {
  if (highest == lowest) return 0;
  return (score - lowest) * kMaxScore / (highest - lowest);
}

std::vector<uint32_t> ArtifactNodeRanks(size_t nodes, uint64_t seed) {
  std::vector<uint32_t> rank(nodes);
  std::iota(rank.begin(), rank.end(), 0U);
  Rng rng(seed ^ 0x5bd1e9955bd1e995ULL);
  for (size_t i = nodes; i > 1; --i) std::swap(rank[i - 1], rank[rng.Below(i)]);
  return rank;
}

std::optional<Decision> ArtifactChoose(const Cluster& cluster, const Pod& pod,
                                       const ArtifactPolicy& policy, std::span<const uint32_t> rank,
                                       Rng& rng) {
  // Feasible nodes and their scores; a node in the same state as the one scored just before gets
  // its score without asking again (node lists group nodes by type).
  thread_local std::vector<std::pair<size_t, double>> scored;
  scored.clear();
  const Node* last = nullptr;
  bool last_fits = false;
  double last_score = 0;
  for (size_t i = 0; i < cluster.nodes.size(); ++i) {
    const Node& node = cluster.nodes[i];
    if (last == nullptr || !SameState(*last, node)) {
      last = &node;
      last_fits = Fits(node, pod);
      if (last_fits) last_score = policy.Score(node, pod);
    }
    if (last_fits) scored.emplace_back(i, last_score);
  }
  if (scored.empty()) return std::nullopt;
  if (policy.DrawsNode()) {
    const size_t i = scored[rng.Below(scored.size())].first;
    return Decision{i, NodeScore{0, policy.Gpus(cluster.nodes[i], pod, rng)}};
  }
  const size_t k = ArtifactPick(std::span(scored), policy,
                                [&](size_t a, size_t b) { return rank[a] < rank[b]; });
  const size_t chosen = scored[k].first;
  return Decision{chosen, NodeScore{scored[k].second, policy.Gpus(cluster.nodes[chosen], pod, rng)}};
}

void NormalizeScores(std::span<std::pair<size_t, double>> scored) {
  int64_t lowest = INT64_MAX, highest = INT64_MIN;
  for (const auto& [i, s] : scored) {
    lowest = std::min(lowest, static_cast<int64_t>(s));
    highest = std::max(highest, static_cast<int64_t>(s));
  }
  for (auto& [i, s] : scored)
    s = static_cast<double>(NormalizeScore(static_cast<int64_t>(s), lowest, highest));
}

ReplayResult ArtifactReplay(const Cluster& cluster_in, std::span<const Pod> arrivals,
                            const ArtifactPolicy& policy, const TypicalPods& typical,
                            std::span<const double> report_points, uint64_t seed,
                            std::vector<std::optional<Decision>>* decisions) {
  ReplayCluster state(cluster_in, typical);
  ReplayResult r = state.Start(policy.Name(), seed);
  const double capacity = static_cast<double>(std::max<int64_t>(r.capacity_milli, 1));
  // The analysis divides by the GPU count, then by 10, to get percent.
  const double gpus = capacity / kMilliPerGpu;
  // Per whole percent of arrived load: the sum and count of the logged allocation (percent,
  // rounded to 2 decimals) and of the fragmentation.
  struct Bucket {
    double alloc = 0, frag = 0, frag_of_idle = 0;
    int64_t n = 0;
  };
  std::map<int64_t, Bucket> buckets;
  Rng rng(seed ^ 0x9e3779b97f4a7c15ULL);
  const std::vector<uint32_t> rank = ArtifactNodeRanks(state.cluster().nodes.size(), seed);
  if (decisions) decisions->clear();
  for (const Pod& pod : arrivals) {
    std::optional<Decision> d = ArtifactChoose(state.cluster(), pod, policy, rank, rng);
    state.Arrive(pod, d, r);
    if (decisions) decisions->push_back(d);
    const int64_t arrived = state.arrived(), allocated = state.allocated();
    const double fragmented = state.fragmented();
    const auto pct = static_cast<int64_t>(std::nearbyint(static_cast<double>(arrived) / gpus / 10));
    Bucket& b = buckets[pct];
    b.alloc += std::round(static_cast<double>(allocated) / gpus / 10 * 100) / 100;
    b.frag += fragmented / kMilliPerGpu;
    const double idle = static_cast<double>(r.capacity_milli - allocated);
    b.frag_of_idle += idle > 0 ? fragmented / idle : 0;
    ++b.n;
  }
  for (const double point : report_points) {
    const auto pct = static_cast<int64_t>(std::lround(point * 100));
    Bucket sum;
    auto add = [&](int64_t at) {
      if (auto it = buckets.find(at); it != buckets.end()) {
        sum.alloc += it->second.alloc, sum.frag += it->second.frag;
        sum.frag_of_idle += it->second.frag_of_idle, sum.n += it->second.n;
      }
    };
    add(pct);
    if (sum.n == 0) add(pct - 1), add(pct + 1);
    if (sum.n == 0) continue;
    const double n = static_cast<double>(sum.n);
    r.points.push_back(LoadPoint{point, sum.alloc / n / 100, sum.frag / n, sum.frag_of_idle / n});
  }
  r.final = state.Now();
  return r;
}

}  // namespace gpulet::placement
