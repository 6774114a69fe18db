// Per-process GPU use, attributed to pods: what dcgm-exporter (4.6+) does for
// DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED with --kubernetes-virtual-gpus.
//
//   NVML  nvmlDeviceGetComputeRunningProcesses_v3  → pid, bytes used (and the MIG GPU instance)
//         nvmlDeviceGetProcessUtilization          → pid, SM utilisation since the last read
//   /proc/<pid>/cgroup                             → the pod UID in the process's cgroup path
//   (pod UID → pod name: the pods the kubelet lists on that GPU, with UIDs from the API server)
//
// A pod's value is the sum over its processes: SM percent for GPU_UTIL, MiB (each process's bytes
// / 2^20, rounded down) for FB_USED. The reader runs on the collector thread only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/inventory.h"
#include "gpu/nvml.h"
#include "metrics/snapshot.h"

namespace gpulet::metrics {

// The pod UID in the text of a /proc/<pid>/cgroup file (cgroup v1 or v2, cgroupfs or systemd
// driver), or "" when the process is in no pod's cgroup. A path segment "pod<hex and -/_>" names
// it: "/kubepods/burstable/pod1c7f…-…/<container>" (cgroupfs) or
// "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1c7f…_…​.slice/…"
// (systemd, underscores for dashes). Fewer than 32 characters is not a UID.
std::string PodUidFromCgroup(std::string_view cgroup_file);

// The start time of a process (field 22 of /proc/<pid>/stat, clock ticks since boot), or nullopt
// when the text is not a stat line. The command name (field 2) may hold spaces and parentheses:
// the fields are counted from its last ')'.
std::optional<unsigned long long> ProcessStartTime(std::string_view stat_file);

// Reads the processes of a GPU through NVML and resolves each one's pod UID under `proc_root`
// ("/proc" on a host; hostPID is needed in a pod, as for dcgm-exporter).
//
// Pids are reused: a pid's pod is cached together with the process's start time, and a pid whose
// start time changed (another process now) is read again. Both files are read through one open
// /proc/<pid> directory, so they describe the same process (a stale directory of an exited
// process reads nothing). A process whose start time cannot be read is not cached.
class ProcessReader {
 public:
  ProcessReader(const gpu::NvmlFunctions& fn, std::string proc_root);

  // The processes of GPU `g` (handle `dev`) by entity: {g.index, -1} for a whole GPU, or
  // {g.index, gi} per MIG GPU instance. False when NVML could not list them (not supported,
  // lost), in which case `out` is left alone. Utilisation is per process since the previous
  // call for that GPU (whole GPUs only: NVML has none for MIG devices).
  bool Read(const gpu::Gpu& g, nvmlDevice_t dev, std::map<EntityKey, std::vector<ProcessUse>>* out);
  // Called once per collection after the GPUs' Reads: forgets pids no longer listed.
  void EndCollection();

 private:
  std::string PodUid(uint32_t pid);

  const gpu::NvmlFunctions& fn_;
  std::string proc_root_;
  std::map<unsigned, unsigned long long> last_seen_us_;  // newest utilisation sample per GPU
  struct CachedPod {
    unsigned long long start_time = 0;  // identifies the process holding the pid
    std::string uid;
  };
  std::map<uint32_t, CachedPod> uid_cache_;  // pid → pod UID, for the processes seen lately
  std::map<uint32_t, int> uid_age_;          // collections since the pid was last listed
};

// Per pod UID: the sum of its processes' values on one entity (GPU_UTIL: SM %, FB_USED: MiB).
struct PodUse {
  int64_t sm_util = 0;
  int64_t fb_used_mib = 0;
};
std::map<std::string, PodUse> SumByPod(const std::vector<ProcessUse>& processes);

}  // namespace gpulet::metrics
