// Enforced GPU memory limits on Allocate (docs/memory-limits.md): for a time-sliced resource named
// in the config's gpulet.memoryLimits, each container gets an accounting region with its share of
// every GPU it receives, and the mounts and environment that make libgpulet-cuda.so enforce it.
//
// A container's share of a GPU: k replicas of that GPU × (perReplica, or the GPU's memory / that
// GPU's replica count in the resource). One directory per Allocate, <stateDir>/<allocation>/:
//
//   devices             the device IDs allocated, one a line              agent's, 0644
//   allocation          when it was allocated (ns since the epoch; larger  agent's, 0644
//                       is newer, also across restarts)
//   gpulet-cuda.limits  each GPU's limit, pass-through (cudashim/region.h) agent's, 0644, mounted
//                                                                          read-only beside the
//                                                                          library
//   cuda/memory.region  usage only (mode 0666)                            the container's: cuda/
//                                                                          is mounted read-write
//
// Only cuda/ is the tenant's; the agent still reads everything here through common/tenant_file.h.
// A directory ends (memory_limits_janitor.h) when a newer Allocate handed out one of its device
// IDs (the kubelet reassigns a device only after its holder ended), or once the pod-resources API
// has confirmably stopped listing all of its IDs (DeviceAbsence).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tenant_file.h"
#include "config/config.h"
#include "config/memory_limits.h"
#include "cudashim/limits_dir.h"
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
  bool passthrough = false;             // the node's choice: the library counts, never refuses
  bool operator==(const MemoryLimitSettings&) const = default;
};

// Where things appear in the container (cudashim/limits_dir.h, shared with the DRA driver).
inline constexpr const char* kContainerLibraryPath = cudashim::kContainerLibraryPath;
inline constexpr const char* kContainerAccountingDir = cudashim::kContainerAccountingDir;
inline constexpr const char* kContainerLimitsFile = cudashim::kContainerLimitsFile;
inline constexpr const char* kContainerPreloadFile = cudashim::kContainerPreloadFile;
inline constexpr const char* kTenantDirName = cudashim::kTenantDirName;
// The device plugin's own bookkeeping in each directory (its janitor reads them).
inline constexpr const char* kDevicesFileName = "devices";
inline constexpr const char* kAllocationFileName = "allocation";

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

// Creates <state_dir>/<allocation>/ (above; cudashim::CreateLimitsDir, then the devices and
// allocation files) and <state_dir>/ld.so.preload, and adds the mounts
// (library and limits read-only, cuda/ read-write, /etc/ld.so.preload read-only) and the env
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

// What a per-container directory says about itself.
struct ContainerDir {
  std::string name;  // the directory's name under the state directory
  std::vector<std::string> device_ids;
  uint64_t allocation = 0;  // larger is newer; 0: unknown (before `allocation` was written)
};

// The per-container directories under `state_dir` (those with a readable `devices` file), read
// through TenantDir: no symlink followed, no FIFO waited on, every file bounded. Others are
// skipped.
std::vector<ContainerDir> ReadContainerDirs(const TenantDir& state_dir);

// The names of the directories a newer Allocate superseded: one of their device IDs was handed
// out again later (a larger `allocation`). Their container has ended.
std::set<std::string> SupersededDirs(const std::vector<ContainerDir>& dirs);

// A fresh allocation number: the wall clock in nanoseconds, strictly increasing in this process.
uint64_t NextAllocationNumber();

}  // namespace gpulet::deviceplugin
