// gpulet's own extension of the device-plugin config: enforced GPU memory limits for time-sliced
// resources (docs/memory-limits.md). NVIDIA's plugin ignores the top-level `gpulet` key, and a
// file without it behaves as before.
//
//   gpulet:
//     memoryLimits:
//       resources:                      # non-empty
//         - name: nvidia.com/gpu        # a time-sliced resource: its name or advertised name
//           perReplica: auto            # GPU memory / that GPU's replicas (default), or a size:
//                                       # bytes, or a number with Ki, Mi, Gi or Ti
//           passThrough: false          # true: the library counts and reports, never refuses
//                                       # (the node's choice, written in the read-only limits
//                                       # file; nothing in the container can turn it on)
//       library: /usr/lib/gpulet/libgpulet-cuda.so   # host path (absolute)
//       stateDir: /run/gpulet/memory                 # host directory for per-container regions
//
// Errors (kInvalidInput) are `FILE:LINE: gpulet.memoryLimits.…: problem`; inside our own section
// unknown keys are errors, not warnings. Whether a named resource exists and is time-sliced needs
// the plan: checked by the device plugin (deviceplugin/memory_limits.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "config/config.h"

namespace gpulet::config {

struct MemoryLimitResource {
  std::string name;                     // full name: a bare "gpu" becomes "nvidia.com/gpu"
  std::optional<uint64_t> per_replica;  // bytes; nullopt: GPU memory / that GPU's replicas
  bool pass_through = false;            // count, never refuse (passThrough)
  SourceLocation where;                 // of the list entry
};

struct MemoryLimits {
  std::vector<MemoryLimitResource> resources;
  std::string library = "/usr/lib/gpulet/libgpulet-cuda.so";
  std::string state_dir = "/run/gpulet/memory";
  SourceLocation where;

  // The entry for advertised resource `advertised`: named by it, or by the time-slicing entry of
  // `config` that advertises under it. nullptr when none.
  const MemoryLimitResource* Find(const Config& config, const std::string& advertised) const;
};

// The `gpulet.memoryLimits` section of `yaml_text`, or nullopt when the file has none.
Result<std::optional<MemoryLimits>> ParseMemoryLimits(std::string_view yaml_text,
                                                      const std::string& filename);
// Same, from a file (kNotFound when missing).
Result<std::optional<MemoryLimits>> LoadMemoryLimits(const std::string& path);

// "20Gi" → 21474836480; "512Mi", "1Ti", "4096Ki", plain bytes. nullopt when malformed, zero or
// overflowing.
std::optional<uint64_t> ParseByteSize(std::string_view text);

}  // namespace gpulet::config
