// Pod attribution: which containers hold which GPU, from the kubelet's pod-resources API v1
// (v1.PodResourcesLister/List on /var/lib/kubelet/pod-resources/kubelet.sock).
//
// The kubelet rate-limits that API, so the mapping is fetched on a timer (never per scrape) and
// handed to the Publisher, which re-renders only when it changed. The watcher reconnects when the
// socket file is recreated (kubelet restart) or a call fails; while the kubelet is unreachable the
// last good mapping stays in place, and a warning is logged once per outage.
//
// Device IDs are those gpulet's device plugin (and NVIDIA's) hands out: GPU or MIG UUIDs ("GPU-…",
// "MIG-…") from any resource, GPU indices ("3") and MIG indices ("3:1", GPU 3's MIG device 1)
// from resources under one of `index_resource_prefixes` — each optionally with the replica suffix
// "::n" of time-sliced and MPS resources, which is stripped. So whole, shared, renamed and mig-*
// resources all map back to the physical GPU or MIG GPU instance they use.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "gpu/inventory.h"
#include "gpu/nvml.h"
#include "metrics/snapshot.h"

namespace v1 {
class ListPodResourcesResponse;
}

namespace gpulet::metrics {

inline constexpr std::string_view kDefaultPodResourcesSocket =
    "/var/lib/kubelet/pod-resources/kubelet.sock";

// The entity a device ID names, or nullopt when it is not one of this node's GPUs.
std::optional<EntityKey> ResolveDeviceId(const gpu::Inventory& inventory, std::string_view id,
                                         bool allow_index);

// Where a GPU instance sits: its first memory slice, by (GPU index, GPU instance ID); nullopt when
// unknown. The MIG device names of gpulet's DRA driver carry the placement, not the instance ID.
using MigPlacementLookup =
    std::function<std::optional<unsigned>(unsigned gpu_index, unsigned gpu_instance_id)>;

// A device of gpulet's DRA driver (gpu.gpulet.io, src/dra/names.h) as the entity it uses:
// "gpu-N" and the memory-share device "gpu-N-mem" are GPU N; "gpu-N-mig-<profile>-<start>" is
// the MIG device of GPU N with that profile whose GPU instance starts at <start> (by
// `mig_placement`; without it, only where GPU N has exactly one MIG device of that profile).
// nullopt for another name, a GPU this node does not have, or a MIG device not (yet) in the
// inventory.
std::optional<EntityKey> ResolveDraDevice(const gpu::Inventory& inventory,
                                          std::string_view device_name,
                                          const MigPlacementLookup& mig_placement);

// The lookup over NVML (nvmlGpuInstanceGetInfo's placement of the GPU's instances).
MigPlacementLookup NvmlMigPlacements(std::shared_ptr<const gpu::Nvml> nvml);

// One PodRef per container and device ID: a container holding two replicas of a shared GPU
// ("GPU-…::1", "GPU-…::2") is listed twice, with vgpu "1" and "2", as dcgm-exporter's
// --kubernetes-virtual-gpus series are. Devices that Dynamic Resource Allocation gave a container
// (its dynamic_resources: claims' devices of driver gpu.gpulet.io, ResolveDraDevice) are
// attributed the same way; a memory share's vgpu is its share ID (one series per share).
PodMap BuildPodMap(const v1::ListPodResourcesResponse& response, const gpu::Inventory& inventory,
                   const std::vector<std::string>& index_resource_prefixes,
                   const MigPlacementLookup& mig_placement = {});

// Pod UIDs by (namespace, name): the kubelet's pod-resources API names pods but gives no UID, and
// a process's cgroup gives a UID but no name.
using PodUidMap = std::map<std::pair<std::string, std::string>, std::string>;

// Sets PodRef::uid from `uids` (left "" for a pod not in it). True when every pod had one.
bool ApplyPodUids(PodMap& map, const PodUidMap& uids);

struct PodResourcesOptions {
  std::string socket = std::string(kDefaultPodResourcesSocket);
  std::chrono::milliseconds refresh{std::chrono::seconds(10)};
  std::chrono::milliseconds call_timeout{std::chrono::seconds(5)};
  std::vector<std::string> index_resource_prefixes = {"nvidia.com/"};
  // Lists the UIDs of this node's pods (the API server); null: pods carry no UID. Called when a
  // pod the kubelet lists is not in the last answer.
  std::function<Result<PodUidMap>()> list_pod_uids;
  // For DRA MIG devices (BuildPodMap); the exporter sets NvmlMigPlacements.
  MigPlacementLookup mig_placement;
};

class PodResourcesWatcher {
 public:
  PodResourcesWatcher(const gpu::Inventory& inventory, PodResourcesOptions options,
                      std::function<void(PodMap)> on_map);
  ~PodResourcesWatcher();  // Stop()s
  PodResourcesWatcher(const PodResourcesWatcher&) = delete;
  PodResourcesWatcher& operator=(const PodResourcesWatcher&) = delete;

  // One List call now (connecting or reconnecting as needed). kUnavailable when the kubelet
  // cannot be reached.
  Result<PodMap> ListOnce();
  // Lists once (a failure is logged, not fatal: the kubelet may come later), then refreshes on
  // the timer.
  void Start();
  void Stop();
  // Refreshes done so far (Start's and the timer's, failed or not); waits up to `timeout` for
  // at least `n`. For tests, which count refreshes instead of sleeping.
  uint64_t refreshes() const;
  bool WaitForRefreshes(uint64_t n, std::chrono::milliseconds timeout) const;

 private:
  struct Connection;

  const gpu::Inventory& inventory_;
  PodResourcesOptions options_;
  std::function<void(PodMap)> on_map_;
  std::unique_ptr<Connection> conn_;  // used by one thread at a time (Start's caller, then Run)
  bool failing_ = false;
  PodUidMap uids_;  // the last answer of list_pod_uids; same thread discipline as conn_
  bool uids_failing_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t refreshes_ = 0;  // guarded by mu_
  mutable std::condition_variable refreshed_;
  std::thread thread_;
};

}  // namespace gpulet::metrics
