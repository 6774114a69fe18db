// Allocate responses as container runtimes expect them (nvidia-container-toolkit's envvar and
// volume-mount protocols, CDI annotations and the CRI cdi_devices field). Pure: no I/O.
//
// Shared resources: replica IDs ("<uuid>::<n>") are stripped to their backing device and
// de-duplicated, so a container given two replicas of one GPU is told that GPU once. MIG devices
// are named by their MIG UUID (or "<gpu>:<mig>" with deviceIDStrategy index); with device specs
// the parent /dev/nvidiaN and the MIG device's GI and CI capability nodes are passed.
// MPS resources also get the daemon's pipe directory (mounted at /mps/<dir>/pipe, named by
// CUDA_MPS_PIPE_DIRECTORY) and its shm directory (mounted at /dev/shm), and per container
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (the largest share of one GPU it holds: 100 × replicas held /
// replicas of that GPU, at least 1) and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("<ordinal>=<MiB>M" per
// GPU, comma-separated; memory × replicas held / replicas). Ordinals are the container's CUDA
// device numbers: its GPUs ranked by NVML index (PCI order, which CUDA uses for identical GPUs).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "deviceplugin/memory_limits.h"
#include "deviceplugin/preferred.h"
#include "deviceplugin_v1beta1.pb.h"
#include "gpu/inventory.h"
#include "sharing/plan.h"

namespace gpulet::deviceplugin {

// Host directories of one MPS daemon (see mps::PathsFor).
struct MpsMount {
  std::string pipe_dir;
  std::string shm_dir;
  bool operator==(const MpsMount&) const = default;
};

// Told of every successful Allocate (the memory pool's publisher counts units with it). Called
// on the gRPC thread that served the Allocate: must be quick and thread-safe.
class AllocationListener {
 public:
  virtual ~AllocationListener() = default;
  virtual void OnAllocate(const sharing::Resource& resource,
                          const std::vector<std::string>& device_ids) = 0;
};

struct AllocateOptions {
  std::vector<config::DeviceListStrategy> device_list_strategies = {
      config::DeviceListStrategy::kEnvvar};
  config::DeviceIdStrategy device_id_strategy = config::DeviceIdStrategy::kUuid;
  bool pass_device_specs = false;
  std::string nvidia_dev_root = "/";  // host root of /dev/nvidia*
  // CDI: annotation keys are "<prefix><plugin>_<unique>", device names "<kind>=<id>".
  std::string cdi_annotation_prefix = "cdi.k8s.io/";
  std::string cdi_kind = "nvidia.com/gpu";
  // GetPreferredAllocation's choice among replicas of shared resources.
  ReplicaPolicy replica_policy = ReplicaPolicy::kDistributed;
  // MPS resources' daemon directories, by resource name.
  std::map<std::string, MpsMount> mps;
  // Time-sliced and memory-pool resources with enforced memory limits, by resource name
  // (memory_limits.h).
  std::map<std::string, MemoryLimitSettings> memory_limits;
  // GetPreferredAllocation's choice of GPU for memory-pool requests.
  config::MemoryPlacement memory_placement = config::MemoryPlacement::kBestFit;
  // Told of every successful Allocate; may be null. Compared by identity.
  std::shared_ptr<AllocationListener> allocation_listener;

  bool operator==(const AllocateOptions&) const = default;
};

// Builds the response for one container request. `unique` supplies the per-response part of the
// CDI annotation key (the kubelet merges the annotations of a pod's containers, so keys must not
// collide); tests pass a fixed one.
// Errors (kInvalidInput): an ID the resource does not advertise, an ID requested twice, or more
// than one replica of a resource with failRequestsGreaterThanOne; the message names the ID (or
// the count) and the resource. kUnavailable: an MPS resource without an entry in options.mps.
Result<v1beta1::ContainerAllocateResponse> BuildContainerAllocateResponse(
    const sharing::Resource& resource, const gpu::Inventory& inventory,
    const AllocateOptions& options, const std::vector<std::string>& device_ids,
    const std::string& unique);

// Memory-pool resources (sharing.memory): every ID must be a unit of one GPU, else kInvalidInput
// naming the IDs per GPU (a kubelet that ignored GetPreferredAllocation); the container gets
// GPULET_GPU_MEMORY_LIMIT (bytes: units × unit) and GPULET_GPU_MEMORY_UNITS. Whether the limit is
// enforced depends on gpulet.memoryLimits naming the resource (memory_limits.h); without it the
// limit is only accounted.
inline constexpr const char* kMemoryLimitEnv = "GPULET_GPU_MEMORY_LIMIT";
inline constexpr const char* kMemoryUnitsEnv = "GPULET_GPU_MEMORY_UNITS";

// Where the volume-mounts strategy points NVIDIA_VISIBLE_DEVICES, and what each mount shows.
inline constexpr const char* kVolumeMountsRoot = "/var/run/nvidia-container-devices";
inline constexpr const char* kVolumeMountsHostPath = "/dev/null";
// Where MPS pipe directories appear in containers.
inline constexpr const char* kMpsContainerRoot = "/mps";

}  // namespace gpulet::deviceplugin
