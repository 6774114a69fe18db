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
#include <optional>
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

// With Dynamic Resource Allocation (gpulet's driver gpu.gpulet.io) there is no Allocate: the
// claim's CDI edits set GPULET_DRA_DEVICES in the container, a comma list of the devices prepared
// for it, each "<device name>=<UUID>" (src/dra/names.h: "gpu-3=GPU-…", a memory share
// "gpu-3-mem=GPU-…" (its GPU), a MIG placement "gpu-3-mig-1g-10gb-0=MIG-…"). Returned as the
// UUIDs, one per device (shares of one GPU are one GPU), for MatchAllocation. An entry without
// "=UUID" stands for its device by count only, as an index entry does ("gpu-3" → "3", a MIG
// placement → "3:<start>"). Errors (kInvalidInput) name the entry: a name the driver never
// publishes, a UUID of the wrong kind (a MIG name with a GPU UUID, a GPU name with a MIG UUID),
// an empty list.
inline constexpr const char* kDraDevicesEnv = "GPULET_DRA_DEVICES";
Result<std::vector<std::string>> ParseDraDevices(const std::string& value);

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
// `source` names the allocation's side in errors (the variable it came from).
Result<PodDevices> MatchAllocation(const gpu::Inventory& seen,
                                   const std::vector<std::string>& allocated,
                                   const std::string& source = "NVIDIA_VISIBLE_DEVICES");

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

// RealMemory in MiB: the cgroup limit (cgroup v2 memory.max or v1 memory.limit_in_bytes text:
// bytes, or "max"/empty for none) capped by MemTotal.
uint64_t ContainerMemoryMib(const std::string& memory_limit, uint64_t mem_total_kib);

// CPUs' worth of CFS quota (quota / period), or nullopt for no quota: from cgroup v2 `cpu.max`
// ("max 100000", "400000 100000") or from cgroup v1 `cpu.cfs_quota_us` ("-1" = none) and
// `cpu.cfs_period_us`. Text that is not a quota reads as none.
std::optional<double> CpuQuotaFromCpuMax(const std::string& cpu_max);
std::optional<double> CpuQuotaFromCfs(const std::string& quota_us, const std::string& period_us);

// What this container's cgroup limits, read under `cgroup_root` (the container's cgroup as
// mounted in it: v2 files at the root; v1 in one directory per controller, `cpu,cpuacct`/`cpu`
// and `memory`, or at the root when it points at a controller's directory). v2 wins when both
// are there.
struct CgroupLimits {
  std::optional<double> cpu_quota;  // see CpuQuotaFromCpuMax
  std::string memory_limit;         // memory.max / memory.limit_in_bytes text; "" when neither
  std::string cpu_source, memory_source;  // the files read ("" when none)
};
CgroupLimits ReadCgroupLimits(const std::string& cgroup_root);

// CPUs= for the node: the cpuset's CPUs, lowered to ceil(quota) when a CFS quota allows fewer
// (a 4-CPU pod on a 192-core host is a 4-CPU node); at least 1.
unsigned ContainerCpus(size_t cpuset_cpus, std::optional<double> cpu_quota);

// Copies the Slurm configuration beside `slurm_conf` (every regular file but gres.conf and dot
// files; a ConfigMap's or Secret's symlinks are followed) into `conf_dir`, next to the gres.conf
// this pod writes (slurmd reads gres.conf from slurm.conf's directory; a ConfigMap mount is
// read-only and shared by every pod). Each copy keeps its source's permission bits and owner: a
// 0600 secret (a JWT key, slurmdbd.conf) stays 0600 and owned as before. gres.conf is 0644.
// Returns the path of the copy of slurm.conf. Errors name the file and the step.
Result<std::string> PrepareConfDir(const std::string& slurm_conf, const std::string& conf_dir,
                                   const std::string& gres_text);

// Whether `status` is the record of a slurmd that started at or after `started`: its
// SlurmdStartTime (scontrol's standard format "2026-12-04T13:40:05", local time; run scontrol
// with SLURM_TIME_FORMAT=standard) is not before `started`'s second. A record an earlier pod of
// the same name left in slurmctld carries its older slurmd's start time, or "None".
bool RegisteredSince(const NodeStatus& status, std::chrono::system_clock::time_point started);

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
