// The broker's configuration: one YAML file (pools, namespaces, thresholds). Every bad value is
// an error naming FILE:LINE: field.path: problem. Durations use the one grammar of
// common/duration.h ("90s", "10m", "1h30m", "500ms", "1d"); a plain number means seconds.
//
//   slurm:
//     nodes: [gpua, gpub]      # the nodes the broker may lend (required, Slurm names = K8s names)
//     minNodes: 1              # floor: Slurm keeps at least this many of them
//     idleTime: 10m            # a node must have run no job for this long to be lent
//     reservationLookahead: 2h # a reservation starting within this claims the node
//     scontrol: scontrol       # programs (name or path)
//     sinfo: sinfo
//     squeue: squeue
//     timeout: 15s             # per command
//   kubernetes:
//     namespaces: [inference]  # where Unschedulable GPU pods count as demand (required)
//     maxNodes: 2              # ceiling and cap on lent nodes
//     minNodes: 0              # floor: lent nodes kept even when idle
//     poolLabel: gpulet.io/pool=inference   # set on a lent node
//     taint: gpulet.io/pool=slurm:NoSchedule # on every node Slurm owns
//     kubeconfig: ""           # empty: in-cluster service account
//   rules:
//     demandEvaluations: 3     # consecutive evaluations of demand before a lend (and of no
//                              # demand before a lend in progress is cancelled)
//     minResidence: 15m        # a node stays at least this long in a pool
//     cooldown: 5m             # between the starts and ends of transitions, globally
//     returnAfterIdle: 30m     # a lent node without inference pods this long goes back
//     evictionTimeout: 10m     # evictions blocked (PDB) this long abort the return
//     interval: 30s            # between evaluations
//   journal: /var/lib/gpulet/broker-journal.json
//   lease: {namespace: gpulet-system, name: gpulet-broker, duration: 90s}   # optional; duration
//                              # must exceed 2 x rules.interval (default 3 x rules.interval);
//                              # namespace: kDefaultLeaseNamespace unless set
//   metrics: {address: ":9402"}
//
// Slurm on Kubernetes (docs/slurm-on-kubernetes.md): slurmd runs in StatefulSet pods, each pod
// is the Slurm node of its name, and lending GPUs to Kubernetes is scaling a pool down. Then
// `slurm.nodes`, `slurm.minNodes`, `kubernetes.poolLabel` and `kubernetes.taint` do not apply
// (slurm.nodes and slurm.minNodes are errors); kubernetes.maxNodes/minNodes count lent pods.
//   slurmOnKubernetes:
//     namespace: slurm          # where the slurmd StatefulSets are (required)
//     pools:                    # at least one
//       - statefulSet: slurmd-h100
//         replicas: 4           # its size with nothing lent (required, >= 1)
//         minReplicas: 1        # Slurm's floor for this pool (default 0)
//         gpus: 4               # GPUs each pod requests (required, >= 1)
//         gpuType: h100         # the gres type its nodes register ("" = untyped)
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "broker/model.h"
#include "common/status.h"

namespace gpulet::broker {

// One slurmd StatefulSet the broker may scale (Slurm on Kubernetes).
struct ScaledPool {
  std::string stateful_set;
  int replicas = 0;
  int min_replicas = 0;
  int gpus = 0;
  std::string gpu_type;  // lower case
};

// The Lease's namespace when the config names none: the one deploy/broker installs the broker
// in, where its Role grants get/create/patch on Leases.
inline constexpr const char* kDefaultLeaseNamespace = "gpulet-system";

struct BrokerConfig {
  // slurm
  std::vector<std::string> nodes;
  int slurm_min_nodes = 0;
  TimeMs idle_time = 10 * 60 * 1000;
  TimeMs reservation_lookahead = 2 * 3600 * 1000;
  std::string scontrol = "scontrol", sinfo = "sinfo", squeue = "squeue";
  TimeMs command_timeout = 15 * 1000;
  // kubernetes
  std::vector<std::string> namespaces;
  int k8s_max_nodes = 1;
  int k8s_min_nodes = 0;
  std::string pool_label_key = "gpulet.io/pool", pool_label_value = "inference";
  std::string taint_key = "gpulet.io/pool", taint_value = "slurm", taint_effect = "NoSchedule";
  std::string kubeconfig;
  // rules
  int demand_evaluations = 3;
  TimeMs min_residence = 15 * 60 * 1000;
  TimeMs cooldown = 5 * 60 * 1000;
  TimeMs return_after_idle = 30 * 60 * 1000;
  TimeMs eviction_timeout = 10 * 60 * 1000;
  TimeMs interval = 30 * 1000;
  // files and endpoints
  std::string journal_path = "/var/lib/gpulet/broker-journal.json";
  std::string lease_namespace, lease_name;  // empty name: no lease (single replica)
  TimeMs lease_duration = 3 * 30 * 1000;    // 3 x interval unless set
  std::string metrics_address = ":9402";

  // Slurm on Kubernetes (empty pools: whole-node lending).
  std::string slurm_namespace;
  std::vector<ScaledPool> pools;

  bool Manages(const std::string& node) const;
  bool SlurmOnKubernetes() const { return !pools.empty(); }
  // The pool whose pods include Slurm node `node` ("<statefulSet>-<ordinal>"), with the ordinal.
  const ScaledPool* PoolOf(const std::string& node, int* ordinal) const;
};

// Parses YAML text; `source` names it in errors. Errors: kInvalidInput "SOURCE:LINE: field: …".
Result<BrokerConfig> ParseBrokerConfig(const std::string& text, const std::string& source);
// Reads and parses FILE (kNotFound when missing).
Result<BrokerConfig> LoadBrokerConfig(const std::string& path);

}  // namespace gpulet::broker
