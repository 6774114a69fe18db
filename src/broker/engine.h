// The broker's decision engine: a pure function of what it observed, what it remembers, its
// configuration and the time. No I/O; every rule below is a table test in engine_test.cc.
//
// Evaluate returns at most one action per evaluation, with a reason, and the journal to persist
// BEFORE the action is carried out (intent first; every action is idempotent, so a crash between
// the write and the action is repaired by re-issuing it).
//
// Rules:
// - Fail closed: a Slurm or Kubernetes view that is not ok, or a node in transit missing from
//   either view, means "unknown": no action, the reason says which read failed.
// - A node in transit is carried forward before anything new starts (one node per step):
//   lending: an admin drain (DRAIN with a reason not starting "gpulet-broker:") abandons the lend
//     and is left alone; demand gone for `demandEvaluations` evaluations cancels the lend
//     (RESUME if our drain is on it); drained (IDLE+DRAIN, not COMPLETING, no job) → admit to
//     Kubernetes (uncordon, remove the Slurm taint, set the pool label); otherwise wait.
//   returning: cordon + taint not seen yet → re-issue; non-DaemonSet pods left → evict them
//     (PDBs respected by the API); still blocked after `evictionTimeout` → abort the return (the
//     node goes back to Kubernetes); no pods → RESUME once slurmd is registered with the GPUs the
//     node had when lent and the drain reason is still ours; an admin's reason → release the node
//     to the admin without RESUME.
// - New transitions wait for the global cooldown (since the last start or end of a transition).
// - Return to Slurm a lent node that has been in Kubernetes for `minResidence` and either has had
//   no inference pods for `returnAfterIdle` or is needed by Slurm's largest capacity-bound
//   pending job (which does not fit in Slurm's pool without it), keeping `kubernetes.minNodes`.
// - Lend when Unschedulable GPU pods were seen `demandEvaluations` evaluations in a row, below the
//   cap `kubernetes.maxNodes`, above the floor `slurm.minNodes`: the managed Slurm node that is
//   idle without any state flag for `idleTime`, in Slurm for `minResidence` since its last
//   return, named by no pending job (ReqNodeList/SchedNodes), claimed by no reservation within
//   `reservationLookahead`, and whose removal leaves Slurm a pool where its largest
//   capacity-bound pending job still fits; the longest idle wins. Drain it (never DOWN).
#pragma once

#include <string>
#include <vector>

#include "broker/config.h"
#include "broker/model.h"

namespace gpulet::broker {

enum class Action {
  kNone,
  kDrain,        // scontrol update state=DRAIN reason="gpulet-broker: …"
  kCancelLend,   // RESUME if DRAIN with our reason, then forget the node
  kAdmit,        // uncordon, remove the Slurm taint, set the pool label
  kStartReturn,  // cordon, add the Slurm taint, remove the pool label
  kEvict,        // Eviction API for each pod in Decision::evict
  kResume,       // RESUME (only when the drain reason is still ours)
  kAbortReturn,  // like kAdmit: the return gave up, the node stays in Kubernetes
  kRelease,      // forget the node without touching Slurm (an admin's drain stays)
  // Slurm on Kubernetes (scaled_engine.h): set a slurmd StatefulSet's spec.replicas from
  // Decision::replicas_from to Decision::replicas_to (refused when it is no longer `from`).
  kScaleDown,  // the highest ordinal's node is drained and idle: replicas - 1
  kScaleUp,    // capacity back to Slurm: replicas + 1
};
const char* ActionName(Action a);

struct Decision {
  Action action = Action::kNone;
  std::string node;
  std::string code;    // short, stable reason label for metrics ("cooldown", "unknown_slurm", …)
  std::string reason;  // one human sentence
  std::string drain_reason;        // kDrain: the Slurm reason to set
  std::vector<std::string> evict;  // kEvict: "namespace/name" of the pods
  std::string stateful_set;        // kScaleDown/kScaleUp: the slurmd StatefulSet
  int replicas_from = 0, replicas_to = 0;
  Journal journal;  // persist before acting
};

Decision Evaluate(const SlurmView& slurm, const KubeView& kube, const Journal& journal,
                  const BrokerConfig& config, TimeMs now);

// Whether `job` could run at all on nodes with these GPU counts (enough nodes with
// gpus_per_node each, enough GPUs in all). Used for the Slurm capacity rules.
bool JobFits(const SlurmJob& job, const std::vector<int>& node_gpus);

}  // namespace gpulet::broker
