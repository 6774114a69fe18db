#include "placement/replay.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace gpulet::placement {

std::vector<Pod> ArrivalSequence(std::span<const Pod> trace, int64_t capacity_milli, double load,
                                 uint64_t seed) {
  std::vector<Pod> out;
  if (trace.empty()) return out;
  Rng rng(seed);
  std::vector<size_t> order(trace.size());
  std::iota(order.begin(), order.end(), size_t{0});
  for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng.Below(i + 1)]);
  const double target = load * static_cast<double>(capacity_milli);
  int64_t total = 0;
  for (const Pod& p : trace) total += p.GpuMilliRequest();
  int64_t arrived = 0;
  auto take = [&](const Pod& p) {
    out.push_back(p);
    arrived += p.GpuMilliRequest();
  };
  for (size_t i = 0; i < order.size() && static_cast<double>(arrived) < target; ++i)
    take(trace[order[i]]);
  if (total == 0) return out;  // no GPU request: the trace once
  while (static_cast<double>(arrived) < target) take(trace[rng.Below(trace.size())]);
  return out;
}

std::vector<double> DefaultReportPoints(double load) {
  std::vector<double> points;
  for (int pct = 50; pct <= static_cast<int>(std::lround(load * 100)); pct += 5)
    points.push_back(pct / 100.0);
  return points;
}

std::string PodTypeName(const Pod& pod) {
  if (pod.num_gpu <= 0) return "cpu";
  if (pod.IsSharing()) return "share";
  return std::to_string(pod.num_gpu) + "-gpu";
}

ReplayCluster::ReplayCluster(const Cluster& cluster, const TypicalPods& typical)
    : cluster_(cluster), typical_(typical), fragmentation_(cluster.nodes.size()) {
  for (size_t i = 0; i < cluster_.nodes.size(); ++i) {
    fragmentation_[i] = typical_.Fragmentation(cluster_.nodes[i]);
    fragmented_ += fragmentation_[i];
  }
  allocated_ = cluster_.GpuAllocatedMilli();
}

ReplayResult ReplayCluster::Start(std::string_view policy, uint64_t seed) const {
  ReplayResult r;
  r.policy = std::string(policy);
  r.seed = seed;
  r.capacity_milli = cluster_.GpuCapacityMilli();
  return r;
}

LoadPoint ReplayCluster::Now() const {
  const int64_t capacity_milli = cluster_.GpuCapacityMilli();
  const double capacity = static_cast<double>(std::max<int64_t>(capacity_milli, 1));
  LoadPoint p;
  p.arrived = static_cast<double>(arrived_) / capacity;
  p.allocated = static_cast<double>(allocated_) / capacity;
  p.fragmented_gpus = fragmented_ / kMilliPerGpu;
  const double idle = static_cast<double>(capacity_milli - allocated_);
  p.fragmented_of_idle = idle > 0 ? fragmented_ / idle : 0;
  return p;
}

void ReplayCluster::Arrive(const Pod& pod, const std::optional<Decision>& d, ReplayResult& r) {
  ++r.pods_arrived;
  arrived_ += pod.GpuMilliRequest();
  if (d) {
    Node& node = cluster_.nodes[d->node];
    Apply(node, pod, d->choice.gpus);
    allocated_ += pod.GpuMilliRequest();
    fragmented_ -= fragmentation_[d->node];
    fragmentation_[d->node] = typical_.Fragmentation(node);
    fragmented_ += fragmentation_[d->node];
  } else {
    ++r.pods_failed;
    FailureCount& f = r.failed[PodTypeName(pod)];
    ++f.pods;
    f.gpu_milli += pod.GpuMilliRequest();
  }
}

ReplayResult Replay(const Cluster& cluster_in, std::span<const Pod> arrivals, const Policy& policy,
                    const TypicalPods& typical, std::span<const double> report_points,
                    uint64_t seed) {
  ReplayCluster state(cluster_in, typical);
  ReplayResult r = state.Start(policy.Name(), seed);
  const double capacity = static_cast<double>(std::max<int64_t>(r.capacity_milli, 1));
  size_t next_point = 0;
  // Tie-breaking gets its own stream, apart from the arrival order's.
  Rng rng(seed ^ 0x9e3779b97f4a7c15ULL);
  for (const Pod& pod : arrivals) {
    state.Arrive(pod, Choose(state.cluster(), pod, policy, rng), r);
    // A point is reached when the arrived request gets to it (to within rounding of the point).
    while (next_point < report_points.size() &&
           static_cast<double>(state.arrived()) >= report_points[next_point] * capacity - 0.5) {
      LoadPoint p = state.Now();
      p.arrived = report_points[next_point++];
      r.points.push_back(p);
    }
  }
  r.final = state.Now();
  return r;
}

std::vector<PolicySummary> Summarize(std::span<const ReplayResult> runs) {
  std::vector<PolicySummary> out;
  for (const ReplayResult& run : runs) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const PolicySummary& s) { return s.policy == run.policy; });
    if (it == out.end()) {
      out.push_back(PolicySummary{run.policy, {}, {}, {}, 0});
      it = out.end() - 1;
    }
    it->seeds.push_back(run.seed);
  }
  for (PolicySummary& s : out) {
    std::vector<const ReplayResult*> mine;
    for (const ReplayResult& run : runs)
      if (run.policy == s.policy) mine.push_back(&run);
    const double n = static_cast<double>(mine.size());
    for (const ReplayResult* run : mine) {
      for (const auto& [type, count] : run->failed)
        s.failed_pods_mean[type] += static_cast<double>(count.pods) / n;
      s.failed_pods_total_mean += static_cast<double>(run->pods_failed) / n;
    }
    size_t points = 0;
    for (const ReplayResult* run : mine) points = std::max(points, run->points.size());
    for (size_t i = 0; i < points; ++i) {
      PointSummary p;
      std::vector<double> values;
      for (const ReplayResult* run : mine) {
        if (i >= run->points.size()) continue;
        const LoadPoint& lp = run->points[i];
        p.arrived = lp.arrived;
        values.push_back(lp.allocated);
        p.fragmented_gpus += lp.fragmented_gpus;
        p.fragmented_of_idle += lp.fragmented_of_idle;
      }
      p.runs = static_cast<int>(values.size());
      const double k = static_cast<double>(values.size());
      p.mean = std::accumulate(values.begin(), values.end(), 0.0) / k;
      p.fragmented_gpus /= k;
      p.fragmented_of_idle /= k;
      double var = 0;
      for (double v : values) var += (v - p.mean) * (v - p.mean);
      p.stddev = values.size() > 1 ? std::sqrt(var / (k - 1)) : 0;
      p.min = *std::min_element(values.begin(), values.end());
      p.max = *std::max_element(values.begin(), values.end());
      s.points.push_back(p);
    }
  }
  return out;
}

}  // namespace gpulet::placement
