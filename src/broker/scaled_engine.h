// The broker's decisions when Slurm runs on Kubernetes (docs/slurm-on-kubernetes.md): slurmd
// runs in StatefulSet pods (one StatefulSet per GPU pool, config `slurmOnKubernetes`), each pod
// is the Slurm node of its name (<statefulSet>-<ordinal>), and GPUs move between the two by
// scaling a pool. A pure function like Evaluate (engine.h), with the same journal, the same
// fail-closed and no-snatching rules, and the same Slurm-side lend rules (GPU types, pending jobs
// that name a node or need it, reservations, idle time, residence).
//
// Rules:
// - Fail closed: a Slurm or Kubernetes view that is not ok, or a pool in transit whose
//   StatefulSet or Slurm node is missing from the views, means "unknown": no action.
// - Lend (Slinky's rule: drain first, remove only drained nodes): a StatefulSet always removes
//   its highest ordinal, so the candidate of a pool is its highest ordinal's node. After
//   `demandEvaluations` evaluations with Unschedulable GPU pods, below kubernetes.maxNodes lent
//   pods and above the pool's minReplicas, the plainly idle candidate (longest idle first) is
//   drained with reason "gpulet: broker scale-down …". Once Slurm shows it drained and idle
//   (IDLE+DRAIN, not COMPLETING, no job), spec.replicas is lowered by one, from exactly
//   ordinal+1 (the scale is refused if it changed). An admin's drain, or any drain not ours, on
//   the node abandons the lend and stays; a job that took the node before the drain, demand gone
//   for `demandEvaluations` evaluations, or replicas raised by someone else cancel it (RESUME only
//   of our own drain).
// - Return (scale up by one): a pool with fewer replicas than its size, whose last lent pod was
//   lent `minResidence` ago, when the inference namespaces had no GPU pods for `returnAfterIdle`
//   or Slurm's largest capacity-bound pending job of the pool's GPU type fits only with the pool's
//   `gpus` more; kubernetes.minNodes lent pods are kept. The return completes when the new pod's
//   node registers in Slurm with GPUs; if it has not after `evictionTimeout` (no free GPUs in
//   Kubernetes: the pod stays Pending), the scale-up is undone (the node never ran a job).
// - The global cooldown separates transitions as in the whole-node mode.
#pragma once

#include "broker/config.h"
#include "broker/engine.h"
#include "broker/model.h"

namespace gpulet::broker {

inline constexpr const char* kStepScalingDown = "scaling-down";
inline constexpr const char* kStepScalingUp = "scaling-up";

Decision EvaluateScaled(const SlurmView& slurm, const KubeView& kube, const Journal& journal,
                        const BrokerConfig& config, TimeMs now);

// "<statefulSet>-<ordinal>".
std::string PodNodeName(const std::string& stateful_set, int ordinal);

}  // namespace gpulet::broker
