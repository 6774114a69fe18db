// The sharing plan: which kubelet resources this node advertises and which physical GPU or MIG
// device backs every advertised device ID. A pure function of the Inventory and the Config (no
// I/O), so every strategy is table-tested and the device plugin only serves what the plan says.
//
// Device IDs are always stable identities (UUIDs, plus "::<n>" for replicas), as NVIDIA's plugin
// advertises them: the kubelet checkpoints the IDs it handed out, and GPU indices may change across
// reboots. deviceIDStrategy decides what the container is told (NVIDIA_VISIBLE_DEVICES, CDI
// names): each device carries both its UUID and its index form.
//
// How the plan is built (docs/sharing.md has the user's view):
// 1. flags.migStrategy turns the inventory into base resources:
//    - none: every GPU (MIG-enabled or not) is one `nvidia.com/gpu` device.
//    - single: if no GPU has MIG enabled, as none. Otherwise every GPU must have MIG enabled and
//      every MIG device the same profile; each MIG device is one `nvidia.com/gpu` device. Anything
//      else is an error (the node then advertises nothing rather than something invalid).
//    - mixed: GPUs without MIG are `nvidia.com/gpu`; MIG devices are
//      `nvidia.com/mig-<profile>`, with '+' in the profile written '.' ("1g.10gb+me" →
//      "mig-1g.10gb.me").
//    A MIG-enabled GPU without MIG devices contributes nothing under single and mixed.
// 2. sharing.timeSlicing / sharing.mps entries select base devices of the resource they name
//    (`devices`: all, the first N, or a list of GPU indexes / UUIDs / MIG indexes / MIG UUIDs; a
//    GPU index or UUID on a MIG-backed resource selects that GPU's MIG devices of the resource)
//    and advertise each as `replicas` IDs "<base id>::<n>" under the entry's advertised name.
//    Entries with the same advertised name form one resource, so one resource may carry different
//    replica counts per GPU (time-slicing only; MPS entries of one resource must agree).
//    Devices no entry selects stay on their base resource, unshared; that requires the shared
//    devices to be renamed (an advertised name cannot mix shared and unshared devices).
// 3. Errors name FILE:LINE: field (kInvalidInput): unknown devices, a device selected twice,
//    MIG ids without a MIG strategy, a MIG resource name under none/single, a count larger than
//    the resource, MPS on MIG devices, MPS replicas above the client ceiling (48, or 16 on GPUs of
//    compute capability < 7.5).
// 4. sharing.memory puts whole GPUs into the memory pool: each selected GPU is advertised as
//    floor(GPU memory / unit) devices "<GPU-UUID>::mem-<k>" (k from 0) under the pool's one
//    resource (default gpulet.io/gpu-memory-<unit>). A GPU is in exactly one pool: one selected
//    by sharing.memory and by timeSlicing/mps is an error naming the sharing entry's
//    FILE:LINE: field and the memory entry; pooled GPUs leave nvidia.com/gpu. MIG-backed devices
//    (migStrategy single on MIG GPUs) cannot be pooled; a GPU with more than kMaxUnitsPerGpu units
//    is an error (choose a larger unit).
// 5. An entry naming a MIG profile this node does not have, with `devices: all`, is skipped and
//    reported in Plan::notes (one config serves many nodes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "gpu/inventory.h"

namespace gpulet::sharing {

// One advertised device ID and what backs it.
struct AdvertisedDevice {
  std::string id;          // what the kubelet sees: "GPU-…", "MIG-…", or "<uuid>::<n>"
  int replica = -1;        // n of "::<n>"; -1 when the device is not a replica
  unsigned gpu_index = 0;  // physical GPU
  std::optional<unsigned> mig_index;  // MIG device on that GPU, when MIG-backed
  std::string uuid;                   // the backing GPU or MIG UUID (health key)
  std::string parent_uuid;            // MIG only: the parent GPU's UUID (its health counts too)
  std::string index;                  // deviceIDStrategy=index form: "3" or "3:1" for MIG
  std::optional<int> numa_node;
  int replicas = 1;  // replicas of the backing device in this resource (1 = not shared);
                     // memory units: the units of that GPU

  bool operator==(const AdvertisedDevice&) const = default;
};

enum class SharingKind { kNone, kTimeSlicing, kMps, kMemory };
const char* SharingKindName(SharingKind k);  // "none", "time-slicing", "mps", "memory"

struct Resource {
  std::string name;         // "nvidia.com/gpu"
  std::string socket_name;  // "nvidia-gpu.sock"
  SharingKind sharing = SharingKind::kNone;
  // Replicas per backing device (1 = not shared); the largest when entries of this resource give
  // different counts per GPU (each device's own count is AdvertisedDevice::replicas).
  int replicas = 1;
  bool fail_requests_greater_than_one = false;
  uint64_t unit_bytes = 0;                // kMemory: bytes per device (unit)
  std::vector<AdvertisedDevice> devices;  // ordered by GPU index, then MIG index, then replica

  const AdvertisedDevice* Find(const std::string& id) const;
  bool operator==(const Resource&) const = default;
};

struct Plan {
  std::vector<Resource> resources;  // sorted by name, names unique
  // Things skipped that the operator may want to know (logged by the plugin).
  std::vector<std::string> notes;

  const Resource* Find(const std::string& name) const;
};

// "nvidia.com/gpu" → "nvidia-gpu.sock", "nvidia.com/mig-1g.10gb" → "nvidia-mig-1g.10gb.sock".
std::string SocketNameFor(const std::string& resource_name);

// "1g.10gb+me" → "nvidia.com/mig-1g.10gb.me".
std::string MigResourceName(const std::string& profile);

// "GPU-x::3" → "GPU-x"; an ID without "::" is returned unchanged.
std::string BaseDeviceId(const std::string& id);

// "<GPU-UUID>::mem-<k>": the ID of memory unit k of a GPU.
std::string MemoryUnitId(const std::string& gpu_uuid, int k);
// Memory units one GPU may be split into (more makes the kubelet's device list unwieldy).
inline constexpr uint64_t kMaxUnitsPerGpu = 4096;

// The most MPS clients one GPU of compute capability major.minor serves.
int MpsClientLimit(int cc_major, int cc_minor);

// Builds the plan (see the rules above).
Result<Plan> BuildPlan(const gpu::Inventory& inventory, const config::Config& config);

// True when the two inventories have the same GPUs and MIG devices (UUIDs, indexes, profiles,
// MIG mode, capability nodes): what a re-discovery compares to decide whether to re-plan.
bool SameDevices(const gpu::Inventory& a, const gpu::Inventory& b);

}  // namespace gpulet::sharing
