// The sharing plan: which kubelet resources this node advertises and which physical GPU or MIG
// device backs every advertised device ID. A pure function of the Inventory and the Config (no
// I/O), so every strategy is table-tested and the device plugin only serves what the plan says.
//
// Device IDs are always stable identities (UUIDs, plus "::<n>" for replicas), as NVIDIA's plugin
// advertises them: the kubelet checkpoints the IDs it handed out, and GPU indices may change across
// reboots. deviceIDStrategy decides what the container is told (NVIDIA_VISIBLE_DEVICES, CDI
// names): each device carries both its UUID and its index form.
#pragma once

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

  bool operator==(const AdvertisedDevice&) const = default;
};

enum class SharingKind { kNone, kTimeSlicing, kMps };

struct Resource {
  std::string name;         // "nvidia.com/gpu"
  std::string socket_name;  // "nvidia-gpu.sock"
  SharingKind sharing = SharingKind::kNone;
  int replicas = 1;  // per backing device (1 = not shared)
  bool fail_requests_greater_than_one = false;
  std::vector<AdvertisedDevice> devices;  // ordered by GPU index, then MIG index, then replica

  const AdvertisedDevice* Find(const std::string& id) const;
  bool operator==(const Resource&) const = default;
};

struct Plan {
  std::vector<Resource> resources;  // sorted by name, names unique

  const Resource* Find(const std::string& name) const;
};

// "nvidia.com/gpu" → "nvidia-gpu.sock", "nvidia.com/mig-1g.10gb" → "nvidia-mig-1g.10gb.sock".
std::string SocketNameFor(const std::string& resource_name);

// Builds the plan. With migStrategy none every GPU is one `nvidia.com/gpu` device. Errors
// (kInvalidInput) name the config field when the config asks for something the inventory or this
// version cannot provide.
Result<Plan> BuildPlan(const gpu::Inventory& inventory, const config::Config& config);

}  // namespace gpulet::sharing
