// Enforced GPU memory limits on Allocate (docs/memory-limits.md): for a time-sliced resource named
// in the config's gpulet.memoryLimits, each container gets an accounting region with its share of
// every GPU it receives, and the mounts and environment that make libgpulet-cuda.so enforce it.
//
// A container's share of a GPU: k replicas of that GPU × (perReplica, or the GPU's memory / that
// GPU's replica count in the resource). Its directory, <stateDir>/<allocation>/, holds
// memory.region (mode 0666, every user of the container writes it) and `devices` (the device IDs
// allocated, one a line), which is how the directory is found again: it is removed once the
// pod-resources API no longer lists any of those IDs.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "config/memory_limits.h"
#include "cudashim/region.h"
#include "deviceplugin_v1beta1.pb.h"
#include "gpu/inventory.h"
#include "sharing/plan.h"

namespace gpulet::deviceplugin {

// What one resource server needs to enforce memory.
struct MemoryLimitSettings {
  std::optional<uint64_t> per_replica;  // bytes; nullopt: GPU memory / that GPU's replicas
  std::string library;                  // host path of libgpulet-cuda.so
  std::string state_dir;                // host directory of the per-container directories
  bool operator==(const MemoryLimitSettings&) const = default;
};

// Where things appear in the container.
inline constexpr const char* kContainerLibraryPath = "/usr/lib/gpulet/libgpulet-cuda.so";
inline constexpr const char* kContainerAccountingDir = "/run/gpulet/cuda";
inline constexpr const char* kContainerPreloadFile = "/etc/ld.so.preload";
inline constexpr const char* kDevicesFileName = "devices";

// The settings per advertised resource name. Errors (kInvalidInput, at the entry's FILE:LINE):
// a named resource the plan does not advertise, or one that is not time-sliced.
Result<std::map<std::string, MemoryLimitSettings>> ResolveMemoryLimits(
    const config::MemoryLimits& limits, const config::Config& config, const sharing::Plan& plan);

// Loads gpulet.memoryLimits from the config's file (config.source; none when empty) and resolves
// it against the plan.
Result<std::map<std::string, MemoryLimitSettings>> LoadMemoryLimitSettings(
    const config::Config& config, const sharing::Plan& plan);

// Each GPU's limit for a container given `ids` (pure). kInvalidInput for an ID the resource does
// not advertise; kNotFound for a GPU missing from the inventory.
Result<std::vector<cudashim::GpuLimit>> ContainerMemoryLimits(const sharing::Resource& resource,
                                                              const gpu::Inventory& inventory,
                                                              const MemoryLimitSettings& settings,
                                                              const std::vector<std::string>& ids);

// Creates <state_dir>/<allocation>/ (memory.region, devices) and <state_dir>/ld.so.preload, and
// adds the mounts (library read-only, the directory, /etc/ld.so.preload read-only) and the env
// (GPULET_CUDA_DIR) to `response`. Errors name the path and the cause.
Status AddMemoryLimits(const MemoryLimitSettings& settings,
                       const std::vector<cudashim::GpuLimit>& gpus,
                       const std::vector<std::string>& ids, const std::string& allocation,
                       v1beta1::ContainerAllocateResponse* response);

// Both of the above for resource `resource_name` when `settings` names it; nothing otherwise.
Status ApplyMemoryLimits(const std::map<std::string, MemoryLimitSettings>& settings,
                         const sharing::Resource& resource, const gpu::Inventory& inventory,
                         const std::vector<std::string>& ids, const std::string& allocation,
                         v1beta1::ContainerAllocateResponse* response);

// Removes the per-container directories under `state_dir` none of whose device IDs is in
// `listed` (every device ID the pod-resources API lists), once older than `grace`: a directory
// an Allocate just made may not be listed by the kubelet yet. Returns the directories removed.
std::vector<std::string> RemoveReleasedContainerDirs(const std::string& state_dir,
                                                     const std::set<std::string>& listed,
                                                     std::chrono::system_clock::time_point now,
                                                     std::chrono::seconds grace);

}  // namespace gpulet::deviceplugin
