// What the pool broker observes and remembers. Plain values, no I/O: the adapters (slurm_side.h,
// k8s_side.h) fill the views, the journal (journal.h) persists the memory, and the engine
// (engine.h) decides from both.
//
// Times are milliseconds since the Unix epoch (int64), so the journal and the views compare
// without clock types and tests script time freely.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace gpulet::broker {

using TimeMs = int64_t;

// The prefix of every Slurm drain reason the broker sets. A drained node whose reason does not
// start with it was drained by someone else and the broker never resumes it. It does not start
// with slurm::kReasonPrefix ("gpulet:"), so the health drainer never resumes the broker's drains.
inline constexpr const char* kBrokerReasonPrefix = "gpulet-broker:";

// Slurm on Kubernetes: the drain reason the broker sets on the highest ordinal's node before it
// scales a slurmd StatefulSet down. It starts with "gpulet:" as every drain gpulet makes in this
// mode (contract of issue 17); only a drain with exactly this prefix is resumed by the broker.
inline constexpr const char* kScaleDownReasonPrefix = "gpulet: broker scale-down";

// One Slurm node as sinfo reports it.
struct SlurmNode {
  std::string name;
  std::string state;            // base state, lower case: "idle", "mixed", "allocated", "down", …
  std::set<std::string> flags;  // upper case: "DRAIN", "COMPLETING", "NOT_RESPONDING", …
  std::string reason;           // drain/down reason, "" when none
  int gpus = 0;                 // GPUs the node registered (its gres gpu count)
  // The same GPUs by gres type, lower case ("h100", "l4", a MIG profile such as "1g.10gb");
  // "" counts GPUs registered without a type.
  std::map<std::string, int> gpu_types;
  int gpus_used = 0;
  int alloc_cpus = 0;    // > 0: some job runs on it
  TimeMs last_busy = 0;  // when a job last ran on it (slurmd start when never)

  bool HasFlag(const std::string& f) const { return flags.count(f) > 0; }
  // GPUs a job asking for `type` can use here: all of them for "", else those of that type
  // (Slurm matches gres types exactly, case aside).
  int GpusOfType(const std::string& type) const;
  bool ReasonIsOurs() const;
  // DRAIN flag set and nothing runs or finishes on it: safe to hand to Kubernetes.
  bool Drained() const;
};

// One Slurm job as squeue reports it.
struct SlurmJob {
  std::string id;
  std::string state;   // "PENDING", "RUNNING", …
  std::string reason;  // state_reason: "Resources", "Priority", "BeginTime", …
  int node_count = 1;
  int gpus_per_node = 0;  // from tres_per_node (gres:gpu[:type]:N)
  int gpus_per_job = 0;   // from tres_per_job (gres:gpu[:type]:N)
  std::string gpu_type;   // the gres type asked for, lower case; "" when any GPU will do
  std::set<std::string> required_nodes;  // expanded ReqNodeList
  std::set<std::string> sched_nodes;     // expanded SchedNodes (where the scheduler plans it)

  bool Pending() const { return state == "PENDING"; }
  // Pending because the cluster lacks resources right now: Resources, Priority, or
  // ReqNodeNotAvail (the nodes it could use are drained or down, e.g. lent).
  bool CapacityBound() const {
    return Pending() && (reason == "Resources" || reason == "Priority" ||
                         reason.rfind("ReqNodeNotAvail", 0) == 0 ||
                         reason.rfind("Nodes_required_for_job", 0) == 0);
  }
  // GPUs the job needs in all.
  int TotalGpus() const;
};

struct Reservation {
  std::string name;
  std::set<std::string> nodes;
  TimeMs start = 0;
  TimeMs end = 0;
};

// Slurm as read in one evaluation. ok == false: some read failed or was ambiguous; `error` says
// which. The engine then acts on nothing.
struct SlurmView {
  bool ok = false;
  std::string error;
  std::map<std::string, SlurmNode> nodes;
  std::vector<SlurmJob> jobs;
  std::vector<Reservation> reservations;
};

// One Kubernetes node with what the broker needs from it and its pods.
struct KubeNode {
  std::string name;
  bool unschedulable = false;
  bool slurm_taint = false;    // carries the Slurm-pool taint
  bool pool_label = false;     // carries the inference pool label (key=value)
  int non_daemonset_pods = 0;  // running or pending pods bound to it, but DaemonSet and mirror pods
  int inference_pods = 0;      // of those, the ones in the inference namespaces
  std::vector<std::string> evictable;  // "namespace/name" of those pods (a return evicts them)
};

// A slurmd StatefulSet (Slurm on Kubernetes): its pods are <name>-<ordinal>, ordinals
// 0..replicas-1, and each is the Slurm node of the same name.
struct StatefulSetState {
  std::string name;
  int replicas = 0;        // spec.replicas
  int ready_replicas = 0;  // status.readyReplicas
  std::string resource_version;
};

// Kubernetes as read in one evaluation; ok == false as for SlurmView.
struct KubeView {
  bool ok = false;
  std::string error;
  std::map<std::string, KubeNode> nodes;
  int unschedulable_gpu_pods = 0;  // Unschedulable pods requesting nvidia.com/* in the namespaces
  // Slurm on Kubernetes only: the slurmd StatefulSets (absent when 404) and the pods of the
  // inference namespaces bound to a node and asking for nvidia.com/* (Kubernetes' use of the
  // GPUs it borrowed).
  std::map<std::string, StatefulSetState> stateful_sets;
  int inference_gpu_pods = 0;
};

// Who owns a node. Nodes absent from the journal belong to Slurm.
enum class Owner { kSlurm, kLending, kKubernetes, kReturning };
const char* OwnerName(Owner o);
bool ParseOwner(const std::string& text, Owner* out);

// Steps inside a return (kReturning).
inline constexpr const char* kStepCordoned = "cordoned";
inline constexpr const char* kStepEvicting = "evicting";
inline constexpr const char* kStepDraining = "draining";  // kLending: drain requested
inline constexpr const char* kStepAdmitted = "admitted";  // kKubernetes

struct JournalEntry {
  Owner owner = Owner::kSlurm;
  std::string step;
  TimeMs since = 0;          // when the node entered `owner`
  TimeMs step_since = 0;     // when it entered `step`
  int gpus = 0;              // the GPUs Slurm had registered for it when it was lent
  TimeMs last_pod_seen = 0;  // kKubernetes: last evaluation that saw an inference pod on it
  // Moves the node to `o` at step `s`, both from `now`.
  void Enter(Owner o, std::string s, TimeMs now) {
    owner = o;
    step = std::move(s);
    since = now;
    step_since = now;
  }
  bool operator==(const JournalEntry&) const = default;
};

// The broker's memory: per node owner and step, plus the hysteresis counters.
struct Journal {
  std::map<std::string, JournalEntry> nodes;  // only nodes not plainly owned by Slurm
  int demand_streak = 0;                      // consecutive evaluations with Unschedulable GPU pods
  int quiet_streak = 0;                       // consecutive evaluations without
  TimeMs last_transition = 0;                 // last start or end of a lend or return
  std::map<std::string, TimeMs> returned_at;  // when each node last came back to Slurm

  Owner OwnerOf(const std::string& node) const {
    auto it = nodes.find(node);
    return it == nodes.end() ? Owner::kSlurm : it->second.owner;
  }
  int Lent() const;       // nodes owned by Kubernetes or returning
  int InTransit() const;  // nodes lending or returning
  bool operator==(const Journal&) const = default;
};

// Expands a Slurm hostlist ("gpu[01-03,07],login1") into names. Empty on a malformed list, with
// *ok set to false when given.
std::set<std::string> ExpandHostlist(const std::string& text, bool* ok = nullptr);

}  // namespace gpulet::broker
