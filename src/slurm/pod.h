// slurmd in a Kubernetes pod (`gpulet slurm pod`): the pure parts. The pod asked Kubernetes for
// GPUs; the device plugin's Allocate told the container runtime which ones
// (NVIDIA_VISIBLE_DEVICES), and NVML inside the container sees exactly those. This file turns the
// two views into one agreed device set (or an error naming both sides), describes the pod to Slurm
// as a dynamic node
// (`slurmd -Z --conf "CPUs=… RealMemory=… Gres=… Feature=…"`, Slurm 22.05+), and holds the
// decisions of the pod's life: busy or idle, drain on termination, delete when idle.
//
// Contract with the manifests and the broker (docs/slurm-pod-entrypoint.md):
// - node name = the pod name; partition and features from the pod labels
//   slurm.gpulet.io/partition and slurm.gpulet.io/features. Slurm 22.05 puts dynamic nodes in
//   partitions through NodeSets selected by feature, so the partition is also a feature of the
//   node (slurm.conf: `NodeSet=<p> Feature=<p>` + `PartitionName=<p> Nodes=<p>`).
// - drain reasons start with "gpulet:"; a node drained with anyone else's reason keeps it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "gpu/inventory.h"
#include "slurm/command.h"
#include "slurm/gres.h"
#include "slurm/scontrol.h"

namespace gpulet::slurm {

inline constexpr const char* kPodPartitionLabel = "slurm.gpulet.io/partition";
inline constexpr const char* kPodFeaturesLabel = "slurm.gpulet.io/features";
inline constexpr const char* kPodBusyLabel = "slurm.gpulet.io/busy";
inline constexpr const char* kPodTerminatingReason = "gpulet: pod terminating";

// NVIDIA_VISIBLE_DEVICES as Allocate sets it: a comma list of GPU UUIDs, MIG UUIDs, GPU indexes
// or "<gpu>:<mig>" indexes (deviceIDStrategy index). Errors (kInvalidInput) for an unset/empty
// value, "all", "none"/"void" (no allocation by a device plugin to check against).
Result<std::vector<std::string>> ParseAllocatedDevices(const std::string& value);

// The devices both sides agree this container holds. Whole GPUs by UUID; a GPU in MIG mode
// counts as its MIG devices. Index entries (host indexes) cannot be compared with NVML's
// container-local numbering, so they are checked by count only.
struct PodDevices {
  std::vector<std::string> gpus;  // whole GPU UUIDs, NVML order
  std::vector<std::string> migs;  // MIG UUIDs, NVML order
};
// Errors (kInvalidInput) name both sides and the difference: "NVIDIA_VISIBLE_DEVICES
// names GPU-a,GPU-b but NVML in this container sees GPU-a,GPU-c (allocated, not seen: GPU-b;
// seen, not allocated: GPU-c)".
Result<PodDevices> MatchAllocation(const gpu::Inventory& seen,
                                   const std::vector<std::string>& allocated);

// A downward-API labels file: one `key="value"` per line (values are Go-quoted).
std::map<std::string, std::string> ParsePodLabels(const std::string& text);

// Feature= for the node: the partition (if any) first, then the features label's items, without
// duplicates. Errors (kInvalidInput) for an item Slurm cannot take (characters outside
// [A-Za-z0-9_.-]).
Result<std::vector<std::string>> NodeFeatures(const std::map<std::string, std::string>& labels,
                                              const std::string& partition_override);

// Slurm's logical core index for each CPU this container may use: the allowed CPUs' cores
// (from `topology`, OS CPU → core index of the whole machine as ReadCoreIndex gives it; empty =
// one core per CPU) renumbered from 0 in order, as slurmd numbers the cores it can see.
std::map<unsigned, unsigned> ContainerCoreIndex(const std::set<unsigned>& allowed,
                                                const std::map<unsigned, unsigned>& topology);

// RealMemory in MiB: the cgroup limit (memory.max text: bytes or "max") capped by MemTotal.
uint64_t ContainerMemoryMib(const std::string& memory_max, uint64_t mem_total_kib);

// `slurmd --conf` for the dynamic node: "CPUs=4 RealMemory=1024 Gres=gpu:h100:2 Feature=a,b".
std::string DynamicNodeConf(const NodeGres& gres, unsigned cpus, uint64_t real_memory_mib,
                            const std::vector<std::string>& features);

// Jobs allocated on the node, from its state ("ALLOCATED", "MIXED+DRAIN", "IDLE+COMPLETING"…).
bool NodeBusy(const NodeStatus& status);

// The merge patch that labels the pod busy or idle.
std::string BusyLabelPatch(bool busy);

// The Slurm side of one pod's node.
class PodNode {
 public:
  PodNode(std::shared_ptr<const CommandRunner> runner, std::string node_name,
          std::string scontrol = "scontrol",
          std::chrono::milliseconds timeout = std::chrono::seconds(15));

  const std::string& name() const { return node_; }
  const SlurmClient& client() const { return client_; }

  // What DrainForTermination did.
  enum class DrainOutcome { kDrained, kAdminDrainKept };
  // Drains with kPodTerminatingReason, unless someone else's drain is in place (kept as it is:
  // jobs stay off the node either way).
  Result<DrainOutcome> DrainForTermination() const;
  // Polls the node every `poll` (through `wait`, which returns false to give up) until no job is
  // allocated on it. scontrol errors are retried on the next poll. Returns the last status.
  Result<NodeStatus> WaitIdle(std::chrono::milliseconds poll,
                              const std::function<bool(std::chrono::milliseconds)>& wait) const;
  // `scontrol delete nodename=<name>`. A node already gone is success.
  Status Delete() const;

 private:
  std::shared_ptr<const CommandRunner> runner_;
  SlurmClient client_;
  std::string node_;
  std::string scontrol_;
  std::chrono::milliseconds timeout_;
};

}  // namespace gpulet::slurm
