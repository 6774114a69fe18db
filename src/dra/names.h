// The names gpulet's DRA driver publishes and reads back: the contract between the ResourceSlice
// publisher (slices.*), the kubelet plugin (plugin.*, prepare.*) and the tests' allocator.
// Every device name is a DNS label (RFC 1123: lowercase alphanumerics and '-', at most 63
// characters), as resource.k8s.io/v1 requires.
//
//   gpu-<index>                          the whole GPU, exclusive
//   gpu-<index>-mem                      the GPU's memory as consumable capacity: a device with
//                                        allowMultipleAllocations whose "memory" capacity is shared
//                                        out in --memory-unit steps; each share becomes a
//                                        libgpulet-cuda limit keyed by the GPU's UUID
//   gpu-<index>-mig-<profile>-<start>    a MIG placement, created at Prepare, destroyed at
//                                        Unprepare: <profile> is the profile with '.' and '+' as '-'
//                                        ("1g.10gb+me" → "1g-10gb-me"), <start> the placement's
//                                        first memory slice
//
// The driver is "gpu.gpulet.io"; the pool is the node's name.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace gpulet::dra {

inline constexpr char kDriverName[] = "gpu.gpulet.io";
// Attribute and capacity names are qualified by this domain (or resource.kubernetes.io for the
// standard ones: pciBusID, pcieRoot).
inline constexpr char kAttributeDomain[] = "gpu.gpulet.io";
// Opaque configuration (time-slicing, MPS) in a claim or class: parameters.apiVersion.
inline constexpr char kConfigApiVersion[] = "resource.gpulet.io/v1";

enum class DeviceKind { kGpu, kMemoryShare, kMig };

struct DeviceName {
  DeviceKind kind = DeviceKind::kGpu;
  unsigned gpu_index = 0;
  std::string mig_profile;    // kMig: the profile ("1g.10gb+me"; a slug after ParseDeviceName)
  unsigned mig_start = 0;     // kMig: the placement's first memory slice
};

// "1g.10gb+me" → "1g-10gb-me".
std::string ProfileSlug(std::string_view profile);
std::string FormatDeviceName(const DeviceName& name);
// Parses a published name back; nullopt for a name this driver never publishes. A MIG name's
// mig_profile comes back as the slug: match it against ProfileSlug() of the GPU's profiles.
std::optional<DeviceName> ParseDeviceName(std::string_view name);

// The extended resource a device plugin serves through a socket of this name in the kubelet's
// device-plugins directory, by NVIDIA's and gpulet's naming: "nvidia-gpu.sock" → "nvidia.com/gpu",
// "nvidia-mig-1g.10gb.sock" → "nvidia.com/mig-1g.10gb"; nullopt for any other name.
std::optional<std::string> DevicePluginSocketResource(std::string_view file_name);

// Whether deploy/overlays/dra's DeviceClasses map this extended resource to the driver
// (extendedResourceName): nvidia.com/gpu and nvidia.com/mig-<profile>. One node must not serve
// such a resource from a device plugin too.
bool MappedByShippedDeviceClasses(std::string_view extended_resource);

}  // namespace gpulet::dra
