// The FGD artifact's protocol (hkust-adsl/kubernetes-scheduler-simulator, the simulator behind the
// FGD paper's figures), written anew from what its code does; docs/placement.md lists every step
// with the upstream file it comes from. It differs from the literal protocol of replay.h in what
// decides the numbers:
//   - arrivals: the trace in name order, shuffled with the seed, then pods drawn with replacement
//     appended until the next draw's per-GPU share would pass load x capacity (the simulator's
//     "workload tuning");
//   - typical pods: every shape counted (CPU-only pods too), the most frequent first, equally
//     frequent ones in descending (CPU, share, GPU count, model list) order, cut at 95 %;
//   - scores: each policy is the only score plugin; its score is an integer as the plugin returns
//     it (FGD: sigmoid of the fragmentation decrease in GPUs, times 100, truncated); BestFit's
//     scores are then min-max normalised over the feasible nodes (integer arithmetic); the highest
//     score wins and ties are drawn uniformly (kube-scheduler's selectHost);
//   - GPUs on the chosen node: Random draws among the GPUs that fit, FGD takes the first GPU with
//     its best score, the others the best-fitting GPU; whole-GPU pods the lowest-indexed free GPUs;
//   - measurement: after every pod (placed or failed) the arrived and the allocated GPU share are
//     logged; the value at p % is the mean of the allocation (in %, rounded to 2 decimals) over
//     the pods whose arrived share rounds (half to even) to p % (if none, to p-1..p+1 %).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "placement/cluster.h"
#include "placement/fragmentation.h"
#include "placement/policy.h"
#include "placement/replay.h"

namespace gpulet::placement {

// The typical pods as the artifact builds them from the workload (CPU-only pods included).
TypicalPods ArtifactTypicalPods(std::span<const Pod> pods, double coverage = 0.95);

// The pods in arrival order for one seed. `trace` must be in name order (the pod lists are).
std::vector<Pod> ArtifactArrivals(std::span<const Pod> trace, int64_t capacity_milli, double load,
                                  uint64_t seed);

// One policy as the artifact's score plugin and GPU selection define it.
class ArtifactPolicy {
 public:
  virtual ~ArtifactPolicy() = default;
  virtual std::string_view Name() const = 0;
  // The plugin's score for a node that passed the filter (Fits), before normalisation; integer
  // valued for the artifact's six policies.
  virtual double Score(const Node& node, const Pod& pod) const = 0;
  // Scores are min-max normalised over the feasible nodes (BestFit's NormalizeScore).
  virtual bool Normalized() const { return false; }
  // The node is drawn uniformly among the feasible ones (Random's PreScore), scores unused.
  virtual bool DrawsNode() const { return false; }
  // The GPUs the pod gets on the node the scheduler chose (the Reserve step).
  virtual GpuSet Gpus(const Node& node, const Pod& pod, Rng& rng) const = 0;
};

// random, dotprod, gpuclustering, gpupacking, bestfit, fgd as the artifact runs them, and our
// fgd-bestfit (its own continuous score, policy.h) under the same protocol; nullptr if unknown.
std::unique_ptr<ArtifactPolicy> MakeArtifactPolicy(std::string_view name,
                                                   const TypicalPods& typical);

// FGD's score for a fragmentation decrease in milli-GPU: sigmoid(decrease / 1000) * 100, truncated.
int64_t FgdScore(double decrease_milli);
// The artifact's NormalizeScore: (score - lowest) * 100 / (highest - lowest) in integers; 0 when
// all scores are equal.
int64_t NormalizeScore(int64_t score, int64_t lowest, int64_t highest);

// The artifact's node names: each node's name is prefixed with its place in a random permutation
// drawn once per run, so the smallest name is a random but fixed order of the nodes.
std::vector<uint32_t> ArtifactNodeRanks(size_t nodes, uint64_t seed);

// The policy's scores of the feasible nodes, (candidate, score) pairs, min-max normalised in place
// with NormalizeScore (BestFit's NormalizeScore over the feasible nodes).
void NormalizeScores(std::span<std::pair<size_t, double>> scored);

// The scheduler's pick among the feasible nodes' scores: normalised first when the policy does,
// then the highest score; among equal scores the candidate that `before(a, b)` puts first (the
// artifact's smallest node name). Returns the position in `scored` (which must not be empty).
// ArtifactChoose and the scheduler extender's prioritize (extender/view.h) both pick with it.
template <class Before>
size_t ArtifactPick(std::span<std::pair<size_t, double>> scored, const ArtifactPolicy& policy,
                    Before before) {
  if (policy.Normalized()) NormalizeScores(scored);
  size_t chosen = 0;
  for (size_t k = 1; k < scored.size(); ++k) {
    const auto& [i, s] = scored[k];
    const double best = scored[chosen].second;
    if (s > best || (s == best && before(i, scored[chosen].first))) chosen = k;
  }
  return chosen;
}

// kube-scheduler's cycle as the artifact configures it: every node filtered and scored
// (percentageOfNodesToScore 100), scores normalised if the policy does, the highest wins; among
// equal scores the node with the smallest name, i.e. the lowest `rank` (the artifact's
// kube-scheduler fork replaces the random draw by this "for reproducibility"); then the GPUs.
// Random draws its node uniformly with `rng`. nullopt when no node fits.
std::optional<Decision> ArtifactChoose(const Cluster& cluster, const Pod& pod,
                                       const ArtifactPolicy& policy, std::span<const uint32_t> rank,
                                       Rng& rng);

// One arrival sequence through a policy on a copy of `cluster`, measured as the artifact's
// analysis scripts do (see above). Points not reached are left out. Node ranks:
// ArtifactNodeRanks(nodes, seed). With `decisions`, each arrival's placement (nullopt: failed),
// in arrival order.
ReplayResult ArtifactReplay(const Cluster& cluster, std::span<const Pod> arrivals,
                            const ArtifactPolicy& policy, const TypicalPods& typical,
                            std::span<const double> report_points, uint64_t seed,
                            std::vector<std::optional<Decision>>* decisions = nullptr);

}  // namespace gpulet::placement
