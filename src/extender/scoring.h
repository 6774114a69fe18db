// The placement policies of src/placement (docs/placement.md) scoring the extender's live nodes, so
// that the policy an operator picks from `gpulet replay` is the one that runs (issue 25 item 5).
//
// What the policies see of a node: its GPU model and each GPU's free share in milli-GPU, i.e.
// free units × 1000 / the GPU's total units, rounded down (so a container that fits in units
// always fits in milli); and its pods by class (sharing / n whole GPUs) from the pods its object
// lists and the extender's reservations. CPU and memory are not the extender's to see: they count
// as 0 on both sides (kube-scheduler's own filters judge them). A one-container pod asking u units
// is a one-GPU pod of max(1, u × 1000 / total) milli, on the scale of the node's largest GPU.
// Pods with several containers keep the extender's own per-container best fit.
//
// Scores are the artifact protocol's (placement/artifact.h, the one `gpulet replay` runs by
// default): each policy's integer score, BestFit's normalised over the nodes of the request. The
// extender answers 0..MaxExtenderPriority (10), too coarse for those scores, so it makes the
// scheduler's pick itself: the best node (highest score; among equal scores the smallest node
// name, the artifact scheduler's tie-break) gets 10, every other node that fits 0..9 by its
// score. kube-scheduler then picks that node whatever its own tie-break (a random draw), as long
// as the extender's weight dominates its other score plugins (docs/memory-requests.md).
// `random` answers 10 for every node that fits: kube-scheduler's draw among equal scores is the
// artifact's uniform draw.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "placement/artifact.h"
#include "placement/cluster.h"
#include "placement/fragmentation.h"

namespace gpulet::extender {

class PlacementScorer {
 public:
  // `policy`: one of placement::PolicyNames() (what `gpulet replay --policy` takes); anything
  // else is kUsage naming the choices. `typical`: the workload's typical pods (FGD's), whose model
  // masks index `models`.
  static Result<std::shared_ptr<const PlacementScorer>> Make(std::string_view policy,
                                                             placement::TypicalPods typical,
                                                             std::vector<std::string> models);
  const placement::ArtifactPolicy& policy() const { return *policy_; }
  const std::vector<std::string>& models() const { return models_; }

 private:
  std::unique_ptr<placement::ArtifactPolicy> policy_;
  std::vector<std::string> models_;
};

// A pod's share of one GPU of `total` units, in milli-GPU: max(1, units × 1000 / total), at most
// 1000.
int32_t ShareOf(int64_t units, int64_t total);

// The extender's answer for the nodes of one prioritize request: `scores[i]` is node i's policy
// score (nullopt: it does not fit, or the policy cannot place the pod there). See above.
std::vector<int> PickScores(const placement::ArtifactPolicy& policy,
                            std::span<const std::optional<double>> scores,
                            std::span<const std::string_view> names);

// The workload a live FGD measures fragmentation against: a pod list in the openb CSV format
// (placement/trace.h), projected as the extender sees pods (CPU and memory 0), its typical pods
// computed as `gpulet replay --protocol artifact` computes them. `models` gets the GPU models its
// gpu_spec column names.
Result<placement::TypicalPods> LoadWorkload(const std::string& path,
                                            std::vector<std::string>& models);

// `gpulet extender --policy NAME --workload FILE`: the scorer for a `gpulet replay --policy` name,
// with the typical pods of the workload for fgd and fgd-bestfit (which refuse to run without
// one); null for `spread` (the extender's own, without a replay counterpart; a workload is then
// ignored with a warning). Unknown names are kUsage, naming the choices.
Result<std::shared_ptr<const PlacementScorer>> PolicyFromFlags(const std::string& policy,
                                                               const std::string& workload);

// The projection itself: a pod as the extender sees it (CPU and memory requests dropped).
placement::Pod GpuOnly(placement::Pod pod);

}  // namespace gpulet::extender
