// What the extender's per-GPU filter buys, on the Alibaba openb trace (docs/memory-requests.md):
// the trace's GPU-sharing pods (one GPU, gpu_milli < 1000) become GPU memory requests, and two
// schedulers place them on the trace's GPU nodes, every GPU in the memory pool:
//   - with the extender: the real ClusterView filters (per-GPU fit) and prioritizes (best fit),
//     binds reserve units, and each node's object is republished only every `publish_every`
//     binds (a publication period in which several pods land), listing the pods the kubelet
//     placed, as the node agent does;
//   - without it: the scheduler counts node totals only (allocatable units minus requests) and
//     picks the least allocated node, as kube-scheduler's NodeResourcesFit does.
// In both, the kubelet then admits a pod only if one GPU of its node has the units (the device
// plugin's rule); a pod admitted by the scheduler and refused there is counted as refused.
// Pods arrive in trace order, the trace repeated until `offered_load` of the fleet's units has
// been asked for; none leaves.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "extender/scoring.h"
#include "placement/cluster.h"

namespace gpulet::extender {

struct ReplayOptions {
  // GiB per GPU model; G2/G3 are undisclosed in the trace and assumed 32 GiB.
  std::map<std::string, int64_t> gpu_memory_gib = {{"P100", 16},    {"T4", 16},  {"V100M16", 16},
                                                   {"V100M32", 32}, {"A10", 24}, {"G2", 32},
                                                   {"G3", 32}};
  double offered_load = 1.0;  // requested units / fleet units at which arrivals stop
  int publish_every = 16;     // binds between two publications of the objects
  // The extender's prioritize: a placement policy (scoring.h), or null for its own best fit.
  std::shared_ptr<const PlacementScorer> placement;
};

struct ReplayCounts {
  int64_t offered = 0;             // pods that arrived
  int64_t admitted = 0;            // by the scheduler (bound)
  int64_t refused_by_kubelet = 0;  // bound, then no single GPU of the node had the units
  int64_t unschedulable = 0;       // no node passed the scheduler
  int64_t placed_units = 0;        // units held by running pods at the end
};

struct ReplayReport {
  int64_t nodes = 0, gpus = 0, fleet_units = 0, sharing_pods = 0;
  ReplayCounts with_extender, node_totals_only;
};

// The request of a sharing pod in GiB units: ceil(gpu_milli × memory / 1000), with the memory of
// the smallest GPU the pod may run on (its gpu_spec models, else any model of the cluster), so the
// request fits the GPU the trace ran it on.
int64_t MemoryRequestUnits(const placement::Pod& pod, const placement::Cluster& cluster,
                           const std::map<std::string, int64_t>& gib);

Result<ReplayReport> ReplayMemoryRequests(const placement::Cluster& cluster,
                                          const std::vector<placement::Pod>& pods,
                                          const ReplayOptions& options);

}  // namespace gpulet::extender
