// Live path = replay (docs/placement.md): the same arrivals placed by the scheduler extender,
// through its verbs as kube-scheduler calls them, and by `gpulet replay --protocol artifact`'s code
// (placement/artifact.h), compared pod by pod: node and GPU.
//
// The inputs (PrepareEquivalence), from a node list and a pod list in the openb format:
//   - the cluster as the extender sees it: GPU nodes, their model and GPUs; CPU and memory
//     counted as 0 on both sides (scoring.h); each node named "<rank>-<name>", its rank in the
//     artifact's random node order for the seed, so that the smallest name, the extender's and
//     the artifact scheduler's tie-break, is the replay's lowest rank;
//   - the arrivals: the artifact's arrivals for the seed and load (ArtifactArrivals), the pods
//     asking for one GPU (a share or a whole one) kept: the pods a memory request can express;
//   - the typical pods: those of the whole pod list, as LoadWorkload computes them for
//     `gpulet extender --workload`;
//   - one memory object per node: 1000 units per GPU (a unit is a thousandth of the GPU), so a
//     pod's units are its milli-GPU share.
// The live side (RunEquivalence), per arrival, as kube-scheduler: the pod created in the API
// server; filter over the nodes of an allowed GPU model (a pod's model list is node affinity,
// kube-scheduler's own filter), prioritize over those that passed, the highest score taken (equal
// scores: the smallest name, the artifact scheduler's selectHost), bind; the GPU is the one the
// extender reserved at bind. Nothing is republished: the reservations carry the bound pods.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "extender/view.h"
#include "placement/cluster.h"
#include "placement/fragmentation.h"

namespace gpulet::extender {

inline constexpr const char* kEquivalenceResource = "gpulet.io/gpu-memory-milli";

struct EquivalenceOptions {
  std::string policy = "fgd";
  uint64_t seed = 42;
  double load = 1.3;    // the artifact's tune ratio
  size_t max_nodes = 0;  // the first N GPU nodes of the list (0: all)
  size_t max_pods = 0;   // the first N arrivals kept (0: all)
};

struct EquivalenceSetup {
  placement::Cluster cluster;             // GPU-only, nodes renamed "<rank>-<name>"
  std::vector<placement::Pod> arrivals;   // one-GPU pods, GPU-only, named p-<n>
  placement::TypicalPods typical;
  std::vector<nlohmann::json> objects;    // the per-node memory ConfigMaps
};

Result<EquivalenceSetup> PrepareEquivalence(const placement::Cluster& nodes,
                                            const std::vector<placement::Pod>& trace,
                                            const EquivalenceOptions& options);

// The extender under test, as the scheduler and the API server reach it.
struct LiveExtender {
  // POST /<verb> with `body`: the answer's HTTP status and body.
  std::function<std::pair<int, std::string>(const std::string& verb, const std::string& body)>
      call;
  // Creates the pod in the API server (bind reads it there).
  std::function<void(const nlohmann::json& pod)> create_pod;
  // The units the extender reserved for the pod on the node at bind.
  std::function<std::optional<std::vector<Assignment>>(const std::string& uid,
                                                       const std::string& node)>
      reserved;
};

struct Placed {
  std::string node;  // "" when the pod was not placed
  int gpu = -1;
  bool operator==(const Placed&) const = default;
};

struct EquivalenceReport {
  std::vector<Placed> live, replay;  // per arrival
  int64_t pods = 0, identical = 0, placed = 0, failed = 0;
  std::vector<std::string> differences;  // the first few, "p-12: live n/3, replay m/0"
  double live_seconds = 0, replay_seconds = 0;
};

// The pod as the API server would hold it (the extender reads it at bind).
nlohmann::json EquivalencePod(const placement::Pod& pod);

Result<EquivalenceReport> RunEquivalence(const EquivalenceSetup& setup,
                                         const EquivalenceOptions& options,
                                         const LiveExtender& live);

// The setup and the replay's side of a report as one JSON document, for a live side outside this
// process (testing/cluster/k8s/fleet `replay`: the real kube-scheduler): "resource" and
// "unitsPerGpu"; "nodes" [{name, model, gpus}] in the setup's order; "objects", the memory
// ConfigMaps; "arrivals" [{name, units, models (empty: any), replay: {node, gpu}}] in arrival
// order (node "" and gpu -1: not placed); "replay" {placed, failed, placedUnits,
// capacityUnits}: the replay's allocation over the arrivals.
nlohmann::json EquivalenceExport(const EquivalenceSetup& setup, const EquivalenceReport& report);

// The live side in process: a ClusterView with the policy (its scorer built from the setup's
// typical pods) and the Extender's verbs called with the request bodies; the API server's pods
// and Bindings kept in memory. (tests/extender/extender_policy_replay_test.cc runs the same
// through HTTP and the fake API server.)
// `live_policy` (empty: options.policy) runs another policy on the live side: a comparison
// that must find differences.
Result<EquivalenceReport> RunEquivalenceInProcess(const EquivalenceSetup& setup,
                                                  const EquivalenceOptions& options,
                                                  const std::string& live_policy = "");

}  // namespace gpulet::extender
