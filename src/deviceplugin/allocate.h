// Allocate responses as container runtimes expect them (nvidia-container-toolkit's envvar and
// volume-mount protocols, CDI annotations and the CRI cdi_devices field). Pure: no I/O.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "deviceplugin_v1beta1.pb.h"
#include "gpu/inventory.h"
#include "sharing/plan.h"

namespace gpulet::deviceplugin {

struct AllocateOptions {
  std::vector<config::DeviceListStrategy> device_list_strategies = {
      config::DeviceListStrategy::kEnvvar};
  config::DeviceIdStrategy device_id_strategy = config::DeviceIdStrategy::kUuid;
  bool pass_device_specs = false;
  std::string nvidia_dev_root = "/";  // host root of /dev/nvidia*
  // CDI: annotation keys are "<prefix><plugin>_<unique>", device names "<kind>=<id>".
  std::string cdi_annotation_prefix = "cdi.k8s.io/";
  std::string cdi_kind = "nvidia.com/gpu";

  bool operator==(const AllocateOptions&) const = default;
};

// Builds the response for one container request. `unique` supplies the per-response part of the
// CDI annotation key (the kubelet merges the annotations of a pod's containers, so keys must not
// collide); tests pass a fixed one.
// Errors (kInvalidInput): an ID the resource does not advertise, or an ID requested twice; the
// message names the ID and the resource.
Result<v1beta1::ContainerAllocateResponse> BuildContainerAllocateResponse(
    const sharing::Resource& resource, const gpu::Inventory& inventory,
    const AllocateOptions& options, const std::vector<std::string>& device_ids,
    const std::string& unique);

// Where the volume-mounts strategy points NVIDIA_VISIBLE_DEVICES, and what each mount shows.
inline constexpr const char* kVolumeMountsRoot = "/var/run/nvidia-container-devices";
inline constexpr const char* kVolumeMountsHostPath = "/dev/null";

}  // namespace gpulet::deviceplugin
