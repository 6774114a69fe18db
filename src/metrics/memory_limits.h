// Per container and GPU, the memory used and the limit of memory-limited time-sliced allocations
// (docs/memory-limits.md), read from the per-container directories the device plugin writes:
//
//   gpulet_container_memory_used_bytes{namespace, pod, container, UUID}
//   gpulet_container_memory_limit_bytes{namespace, pod, container, UUID}
//
// Each directory under the plugin's stateDir holds `devices` (the device IDs the container was
// allocated), `allocation`, the limits file (the GPUs, their UUIDs and limits: the agent's) and
// cuda/memory.region (the usage: the tenant's). The region is read as a tenant's bytes: copied
// with a bounded pread of its fixed header and GPU slots (a FIFO, a symlink, a file truncated or
// rewritten meanwhile is refused or read as it was, never mapped), the copy validated, and only
// the used counters taken from it, at slot indexes the limits file gives. Labels come from the
// agent (UUIDs from the limits file) and from the kubelet (pod-resources owner of the device IDs;
// empty while not listed); a directory a newer Allocate superseded is skipped, so a reused replica
// ID never labels a stale region with its new owner.
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
