// The broker's Kubernetes adapter, on our API client (k8s/client.h).
//
// Observe reads: the Pending pods of each inference namespace (demand = pods whose PodScheduled
// condition is False/Unschedulable and whose containers request or limit some nvidia.com/*
// resource), and for each managed node its Node object and the pods bound to it. A node that
// does not exist (404) is absent from the view; any other failure makes the view not ok.
//
// The pods on a node that a return must evict are those not owned by a DaemonSet, not mirror pods
// (a static pod's copy in the API, annotated kubernetes.io/config.mirror: evicting it removes
// only the copy, which the kubelet makes again) and not finished: kubectl drain's choice.
//
// Actions are idempotent merge patches computed from a fresh read of the Node: Admit (uncordon,
// drop the Slurm taint, set the pool label), StartReturn (cordon, add the taint, drop the label).
// Evict posts an Eviction for each pod: the API server refuses one that a PodDisruptionBudget
// protects (HTTP 429) and the broker simply tries again next evaluation.
//
// Slurm on Kubernetes (config.SlurmOnKubernetes()): Observe also reads each pool's StatefulSet
// (a 404 leaves it out of the view) and counts the inference namespaces' GPU pods bound to a node
// (all pods of those namespaces are listed, not only the Pending ones); no Node is read.
// ScaleStatefulSet sets spec.replicas from a fresh read, refusing (kConflict) when the
// StatefulSet no longer has `from` replicas, and sends that read's resourceVersion with the patch
// so a change in between is refused by the API server (409) rather than overwritten: scaling down
// by one removes exactly the pod the broker drained.
//
// Leader election is lease.h, on the same client.
#pragma once

#include <string>
#include <vector>

#include "broker/config.h"
#include "broker/model.h"
#include "common/status.h"
#include "k8s/client.h"

namespace gpulet::broker {

struct EvictionResult {
  int evicted = 0;  // accepted (or the pod was already gone)
  int blocked = 0;  // refused by a PodDisruptionBudget (429)
};

class KubeSide {
 public:
  KubeSide(const k8s::Client& client, const BrokerConfig& config);

  KubeView Observe() const;
  Status Admit(const std::string& node) const;
  Status StartReturn(const std::string& node) const;
  Result<EvictionResult> Evict(const std::vector<std::string>& pods) const;
  Status ScaleStatefulSet(const std::string& name, int from, int to) const;

  const k8s::Client& client() const { return client_; }

 private:
  Status RewriteTaints(const std::string& node, bool add_ours, bool unschedulable,
                       const nlohmann::json& pool_label) const;

  const k8s::Client& client_;
  const BrokerConfig& config_;
};

// Whether a pod object is demand: Unschedulable and asking for nvidia.com/*.
bool IsUnschedulableGpuPod(const nlohmann::json& pod);
// Whether a pod is bound to a node, not finished, and asks for nvidia.com/*.
bool IsBoundGpuPod(const nlohmann::json& pod);
// RFC 3339 with microseconds ("2026-12-02T23:10:41.123456Z") ↔ ms since the epoch.
std::string FormatMicroTime(TimeMs t);
bool ParseMicroTime(const std::string& text, TimeMs* out);

}  // namespace gpulet::broker
