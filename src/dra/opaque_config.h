// Opaque configuration for gpu.gpulet.io devices: a DeviceClass's or ResourceClaim's
// `config[].opaque` with driver gpu.gpulet.io and parameters of apiVersion resource.gpulet.io/v1.
//
//   apiVersion: resource.gpulet.io/v1
//   kind: GpuConfig               # whole GPUs and memory shares; MigDeviceConfig for MIG devices;
//                                 # each kind applies only to its devices
//   sharing:
//     strategy: TimeSlicing       # TimeSlicing (default) | MPS
//     timeSlicing:
//       interval: Default         # Default | Short | Medium | Long: accepted, not acted on (the
//                                 # node's time slice stays the driver's; warned once)
//     mps:
//       defaultActiveThreadPercentage: 50          # 1..100
//       defaultPinnedDeviceMemoryLimit: 10Gi       # a quantity, > 0, at most 1 PiB
//
// Which config applies to a device: every config whose `requests` is empty or names the device's
// request (with or without "/subrequest"), class configs first, then the claim's, in order; a
// later one replaces an earlier one of the same kind. (This is DRA's rule: claim configs override
// class configs.)
//
// Validation: a config whose apiVersion is not ours is refused; an unknown kind, a wrong type, a
// value out of range, or MPS options with strategy TimeSlicing are refused. Each error names the
// config (OpaqueConfig::where) and the field: "ResourceClaim ns/c: …config[1]: parameters.sharing.
// mps.defaultActiveThreadPercentage: must be 1..100, got 150". Unknown fields are accepted and
// warned once per (kind, field) with the config's place (the compatibility rule).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "dra/claim.h"

namespace gpulet::dra {

enum class ConfigKind { kGpu, kMigDevice };
enum class SharingStrategy { kTimeSlicing, kMps };

struct MpsSettings {
  int active_thread_percentage = 0;  // 0: not set
  uint64_t pinned_memory_bytes = 0;  // 0: not set
  bool operator==(const MpsSettings&) const = default;
};

struct DeviceConfig {
  ConfigKind kind = ConfigKind::kGpu;
  SharingStrategy strategy = SharingStrategy::kTimeSlicing;
  std::string interval;  // time slicing; "" when not given
  MpsSettings mps;
  std::string where;  // the config it came from
  bool operator==(const DeviceConfig&) const = default;
};

const char* SharingStrategyName(SharingStrategy s);  // "TimeSlicing", "MPS"

// Parses and validates one config's parameters (at most 10 KiB; the claim parser bounds it).
// Unknown fields are logged (spdlog warn, event=dra_config_field_ignored) once per kind and field.
Result<DeviceConfig> ParseDeviceConfig(const OpaqueConfig& config);

// The configs that apply to a device of `kind` for `request` (see above); nullopt: none. Errors:
// the first invalid config among those that apply.
Result<std::optional<DeviceConfig>> ConfigFor(const std::vector<OpaqueConfig>& configs,
                                              const std::string& request, ConfigKind kind);

}  // namespace gpulet::dra
