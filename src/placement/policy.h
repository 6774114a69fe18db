// Placement policies: where a pod goes in a cluster, as pure functions of the cluster state.
//
// Contract. A Policy looks at one node and one pod and answers whether the node can host the pod
// and, if so, how much it likes placing it there (higher is better) and which of the node's GPUs
// the pod would use. It reads nothing but its arguments and the configuration it was built with
// (FGD: the typical pods), keeps no state between calls, and is safe to call from several threads
// at once. Scores of one pod on different nodes of the same cluster state are comparable; scores
// of different pods are not. The same code scores a replayed trace (`gpulet replay`) and a live
// cluster (the scheduler extender's prioritize), so what a replay predicts is what the cluster
// does.
//
// Choose() runs a policy over a whole cluster the way kube-scheduler does: filter, score, take the
// highest score, break exact ties uniformly at random.
//
// The six policies of the FGD paper (Weng et al., USENIX ATC '23, section 6), as its public
// simulator defines them; `Name()` is what `--policy` takes:
//   random         any node that fits, uniformly.
//   dotprod        Tetris-style alignment: the dot product of the node's free (CPU, GPU) vector and
//                  the pod's request, both divided by the largest node (128 CPUs, 8 GPUs); a lower
//                  product scores higher. A sharing pod also tries each partly used GPU.
//   gpuclustering  nodes whose GPU pods are all of the pod's class (sharing, or n whole GPUs)
//   first,
//                  then nodes hosting that class among others, then empty nodes, then the rest; a
//                  fuller node first inside each band.
//   gpupacking     a sharing pod on an already shared GPU first (the fuller the better), then free
//                  GPUs of a used node (the fewer the better), then an empty node (the smaller the
//                  better).
//   bestfit        the least weighted leftover after placement:
//                  0.5 * CPU left / 128 CPUs + 0.5 * GPU left / 8 GPUs.
//   fgd            fragmentation gradient descent: the largest decrease of the node's expected
//                  fragmentation (fragmentation.h) caused by the placement; a sharing pod tries
//                  each GPU that fits.
// And one of ours:
//   fgd-bestfit    FGD, and among placements that fragment equally, the best-fitting node (so a
//                  pod that does not change fragmentation still packs instead of spreading).
// Baselines place a sharing pod on the best-fitting GPU of the node; multi-GPU pods take whole
// free GPUs; a pod's GPU-model constraint filters nodes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "placement/cluster.h"
#include "placement/fragmentation.h"

namespace gpulet::placement {

// One way to place a pod on a node.
struct NodeScore {
  double score = 0;  // higher is better
  GpuSet gpus = 0;   // the GPUs the pod would use (empty for a CPU-only pod)
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view Name() const = 0;
  // The best placement of `pod` on `node`, or nullopt when the node cannot host it (Fits fails).
  virtual std::optional<NodeScore> Score(const Node& node, const Pod& pod) const = 0;
};

// The placement of `pod` on `node` (which must fit) that decreases the node's fragmentation the
// most, compared by `key(decrease in milli-GPU)`: a sharing pod tries each GPU with enough free
// share (one per distinct free share: equal shares leave equal states) and the first best is
// kept; other pods take BestFitGpus. The score is key(decrease) of that placement. FGD under both
// protocols: the identity (policy.cc) and the artifact's integer sigmoid (artifact.cc).
NodeScore BestFragmentationDecrease(const TypicalPods& typical, const Node& node, const Pod& pod,
                                    double (*key)(double));

// The policy names MakePolicy knows, the paper's six first.
const std::vector<std::string>& PolicyNames();
// A policy by name; nullptr for an unknown name. FGD-based policies need the typical pods.
std::unique_ptr<Policy> MakePolicy(std::string_view name, const TypicalPods& typical);

// Deterministic random numbers for tie-breaking and shuffling (the same on every platform).
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t Next() { return engine_(); }
  // Uniform in [0, n), n > 0.
  uint64_t Below(uint64_t n);

 private:
  std::mt19937_64 engine_;
};

struct Decision {
  size_t node = 0;  // index into Cluster::nodes
  NodeScore choice;
};

// Scores every node of the cluster and returns the best; exact ties are broken uniformly at random
// with `rng`. nullopt when no node fits.
std::optional<Decision> Choose(const Cluster& cluster, const Pod& pod, const Policy& policy,
                               Rng& rng);

}  // namespace gpulet::placement
