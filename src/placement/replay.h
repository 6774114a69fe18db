// Trace-driven cluster replay, following the FGD paper's experiment (section 6.1): GPU nodes only;
// the trace's pods shuffled with a seed and, once all have arrived, drawn again with replacement,
// until their total GPU request reaches `load` times the cluster's GPU capacity; each pod placed
// by the policy when it arrives, or failed; nothing is retried or removed. After every pod the
// arrived GPU request and the allocated GPU share are known; they are reported at fixed
// arrived-load points.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "placement/cluster.h"
#include "placement/fragmentation.h"
#include "placement/policy.h"

namespace gpulet::placement {

// The pods in arrival order for one seed (the same for every policy).
std::vector<Pod> ArrivalSequence(std::span<const Pod> trace, int64_t capacity_milli, double load,
                                 uint64_t seed);

// 0.50, 0.55, ... up to `load` (inclusive, to within rounding).
std::vector<double> DefaultReportPoints(double load);

struct LoadPoint {
  double arrived = 0;             // arrived GPU request / capacity (the report point)
  double allocated = 0;           // allocated GPU share / capacity when the point was reached
  double fragmented_gpus = 0;     // cluster fragmentation (sum of F(n)) in GPUs
  double fragmented_of_idle = 0;  // fragmented GPUs / idle GPUs
};

struct FailureCount {
  int64_t pods = 0;
  int64_t gpu_milli = 0;
};

struct ReplayResult {
  std::string policy;
  uint64_t seed = 0;
  int64_t capacity_milli = 0;
  int64_t pods_arrived = 0;
  int64_t pods_failed = 0;
  std::vector<LoadPoint> points;  // the report points reached, in order
  // Failed pods by type: "cpu", "share", "1-gpu", "2-gpu", "4-gpu", "8-gpu", ...
  std::map<std::string, FailureCount> failed;
  LoadPoint final;  // after the last pod
};

std::string PodTypeName(const Pod& pod);

// A replay's cluster as the arrivals come: a copy of the cluster, the arrived and allocated GPU
// request, each node's fragmentation and their sum. Both protocols (this file's and artifact.h's)
// advance it one pod at a time.
class ReplayCluster {
 public:
  ReplayCluster(const Cluster& cluster, const TypicalPods& typical);
  const Cluster& cluster() const { return cluster_; }
  // A result to fill: the policy's name, the seed and the cluster's GPU capacity.
  ReplayResult Start(std::string_view policy, uint64_t seed) const;
  // The state now as a load point (arrived and allocated as shares of the capacity).
  LoadPoint Now() const;
  // One arrival: its request counted as arrived, then placed as `d` says (Apply), or failed and
  // counted in r.pods_failed and r.failed.
  void Arrive(const Pod& pod, const std::optional<Decision>& d, ReplayResult& r);
  int64_t arrived() const { return arrived_; }
  int64_t allocated() const { return allocated_; }
  double fragmented() const { return fragmented_; }

 private:
  Cluster cluster_;
  const TypicalPods& typical_;
  std::vector<double> fragmentation_;  // per node
  double fragmented_ = 0;
  int64_t allocated_ = 0;
  int64_t arrived_ = 0;
};

// Places `arrivals` one by one on a copy of `cluster`. `typical` measures fragmentation (and is
// what FGD policies were built with). Tie-breaking draws from a stream seeded by `seed`.
ReplayResult Replay(const Cluster& cluster, std::span<const Pod> arrivals, const Policy& policy,
                    const TypicalPods& typical, std::span<const double> report_points,
                    uint64_t seed);

// Mean and spread over seeds of one policy's runs.
struct PointSummary {
  double arrived = 0;
  double mean = 0, stddev = 0, min = 0, max = 0;  // allocation ratio
  double fragmented_gpus = 0;                     // mean
  double fragmented_of_idle = 0;                  // mean
  int runs = 0;                                   // runs that reached this point
};
struct PolicySummary {
  std::string policy;
  std::vector<uint64_t> seeds;
  std::vector<PointSummary> points;
  std::map<std::string, double> failed_pods_mean;  // by pod type
  double failed_pods_total_mean = 0;
};
// One summary per policy, in the order the policies first appear in `runs`.
std::vector<PolicySummary> Summarize(std::span<const ReplayResult> runs);

}  // namespace gpulet::placement
