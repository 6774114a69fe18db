// A memory-limited container's directory on the host, shared by both adapters that hand out
// memory limits (the device plugin's Allocate, the DRA driver's Prepare): <state_dir>/<name>/
// with the limits file (the agent's, mounted read-only beside the library) and the tenant's cuda/
// region directory, plus <state_dir>/ld.so.preload. What the container must see is returned as
// mounts and env, which each adapter writes in its own protocol (an Allocate response, CDI edits).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "cudashim/region.h"

namespace gpulet::cudashim {

// Where things appear in the container.
inline constexpr const char* kContainerLibraryPath = "/usr/lib/gpulet/libgpulet-cuda.so";
inline constexpr const char* kContainerAccountingDir = "/run/gpulet/cuda";
inline constexpr const char* kContainerLimitsFile = "/usr/lib/gpulet/gpulet-cuda.limits";
inline constexpr const char* kContainerPreloadFile = "/etc/ld.so.preload";
inline constexpr const char* kTenantDirName = "cuda";  // the only part the container writes
inline constexpr const char* kAccountingDirEnv = "GPULET_CUDA_DIR";
// The agent's (the node's) setting, never the container's: the absolute path, as the container
// sees it, of the CUDA driver library the interposer must call. Written into each limits file
// (version 2); unset, the interposer takes the first of kDriverLibraryCandidates that exists.
inline constexpr const char* kNodeDriverEnv = "GPULET_CONTAINER_CUDA_DRIVER";
static_assert(std::string_view(kContainerLimitsFile).ends_with(kLimitsFileName),
              "the library looks for its limits beside itself");

struct LimitsMount {
  std::string container_path;
  std::string host_path;
  bool read_only = true;
  bool operator==(const LimitsMount&) const = default;
};

struct LimitsEdits {
  std::vector<LimitsMount> mounts;  // library, limits file, cuda/ (read-write), preload
  std::vector<std::pair<std::string, std::string>> env;  // GPULET_CUDA_DIR
};

// Creates <state_dir>/<name>/ and its cuda/ (mode 0755), the limits file for `gpus` (mode 0644,
// pass-through when asked), a fresh region in cuda/ (replacing one left there), and
// <state_dir>/ld.so.preload naming the container's library path. `library` is the host path of
// libgpulet-cuda.so. The driver path of the agent's GPULET_CONTAINER_CUDA_DRIVER, when set, goes
// into the limits file. Errors (kInternal) name the path and the cause.
Result<LimitsEdits> CreateLimitsDir(const std::string& state_dir, const std::string& name,
                                    const std::string& library, const std::vector<GpuLimit>& gpus,
                                    bool passthrough);

}  // namespace gpulet::cudashim
