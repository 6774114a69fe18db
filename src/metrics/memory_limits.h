// Per container and GPU, the memory used and the limit of memory-limited time-sliced allocations
// (docs/memory-limits.md), read from the accounting regions the device plugin writes:
//
//   gpulet_container_memory_used_bytes{namespace, pod, container, UUID}
//   gpulet_container_memory_limit_bytes{namespace, pod, container, UUID}
//
// Each per-container directory under the plugin's stateDir holds `devices` (the device IDs the
// container was allocated) and memory.region; the pod, namespace and container come from the
// pod-resources API's owner of those device IDs (empty while the kubelet has not listed them).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gpulet::metrics {

struct ContainerOwner {
  std::string namespace_;
  std::string pod;
  std::string container;
};

struct ContainerMemory {
  ContainerOwner owner;
  std::string uuid;  // the GPU
  uint64_t used = 0;
  uint64_t limit = 0;
};

// Reads every per-container directory under `state_dir`. `owners`: device ID → its container.
// Directories that are not regions of ours (no `devices`, an unreadable or foreign region) are
// skipped.
std::vector<ContainerMemory> ReadContainerMemory(
    const std::string& state_dir, const std::map<std::string, ContainerOwner>& owners);

// The two gauges in the text format (0.0.4; also valid OpenMetrics before its "# EOF").
std::string RenderContainerMemory(const std::vector<ContainerMemory>& samples);

// Both, with owners from the kubelet's pod-resources API on `pod_resources_socket` (unlabelled
// while the kubelet cannot be asked). What the exporter publishes at every collection.
std::string ContainerMemoryText(const std::string& state_dir,
                                const std::string& pod_resources_socket);

}  // namespace gpulet::metrics
