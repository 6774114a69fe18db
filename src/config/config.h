// gpulet's configuration file, in the NVIDIA k8s-device-plugin v1 format so users bring their
// files unchanged:
//
//   version: v1
//   flags: {migStrategy, failOnInitError, mpsRoot, nvidiaDriverRoot, nvidiaDevRoot, gfd: {…},
//           plugin: {passDeviceSpecs, deviceListStrategy, deviceIDStrategy,
//                    containerDriverRoot, cdiAnnotationPrefix, nvidiaCTKPath, kubeletSocket,
//                    sharedDevicesAllocationPolicy}}
//   sharing: {timeSlicing: {renameByDefault, failRequestsGreaterThanOne,
//                           resources: [{name, rename, devices, replicas}]},
//             mps: {same schema},
//             memory: {unit, placement, resources: [{name, rename, devices}]}}   # gpulet's own
//
// Contract:
// - Accept what NVIDIA's parser accepts. Keys it ignores (unknown keys anywhere) and keys it acts
//   on but gpulet does not (top-level `resources` and `imex`, flags.gdsEnabled, mofedEnabled,
//   gdrcopyEnabled, useNodeFeatureAPI, a deviceDiscoveryStrategy other than auto/nvml,
//   plugin.cdiFeatureFlags, …) are not errors: each adds one entry to Config::warnings, naming
//   FILE:LINE: field and what is ignored. timeSlicing and mps together: MPS is used, as upstream
//   does, with a warning. A repeated deviceListStrategy entry is dropped, with a warning.
// - Errors remain for what upstream refuses too: wrong types, invalid enum values, duplicate keys,
//   unknown versions, malformed YAML, resource names that are not DNS subdomains or make a full
//   name over 63 characters. Quoted scalars are strings: `replicas: "4"` is rejected, as Go's
//   decoder rejects it in NVIDIA's plugin.
// - Every error is kInvalidInput with the message `FILE:LINE: dotted.field.path: problem`
//   (LINE is 1-based), e.g. `config.yaml:14: sharing.timeSlicing.resources[0].replicas: must be
//   >= 2, got 1`.
// - Every flag is optional: absent means "not set in the file", so callers can apply the
//   precedence CLI > environment > file > built-in default (see Overlay). A YAML null counts as
//   absent.
// - A missing `version` is read as v1 (NVIDIA's plugin does the same).
// - What needs the inventory (does device "7" exist? is a GPU in two resources?) is checked by the
//   sharing planner, which reports it with the SourceLocation kept on each resource and device.
// - Never throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gpulet::config {

// Where a value came from, for errors raised after parsing (by the planner).
struct SourceLocation {
  std::string file;   // as passed to ParseConfig
  int line = 0;       // 1-based; 0 when unknown
  std::string field;  // dotted path, e.g. "sharing.timeSlicing.resources[0].devices[2]"

  // "FILE:LINE: FIELD" (the prefix every config error carries).
  std::string ToString() const;
};

// kInvalidInput, "FILE:LINE: FIELD: problem".
Status InvalidAt(const SourceLocation& where, const std::string& problem);

enum class MigStrategy { kNone, kSingle, kMixed };
enum class DeviceListStrategy { kEnvvar, kVolumeMounts, kCdiAnnotations, kCdiCri };
enum class DeviceIdStrategy { kUuid, kIndex };

// Names as written in files, flags and environment variables: "none", "volume-mounts", "uuid", …
const char* MigStrategyName(MigStrategy s);
const char* DeviceListStrategyName(DeviceListStrategy s);
const char* DeviceIdStrategyName(DeviceIdStrategy s);

// Parsers for flag and environment values (kInvalidInput, message: `invalid value "x" (want
// none|single|mixed)`; the caller prefixes the flag or variable name).
Result<MigStrategy> ParseMigStrategy(std::string_view text);
Result<DeviceIdStrategy> ParseDeviceIdStrategy(std::string_view text);
// One name or a comma-separated list ("envvar,cdi-annotations"); a repeated name counts once (as
// upstream); empty lists and empty items are errors.
Result<std::vector<DeviceListStrategy>> ParseDeviceListStrategies(std::string_view text);
// "distributed" | "packed" (flags.plugin.sharedDevicesAllocationPolicy).
Result<std::string> ParseSharedDevicesAllocationPolicy(std::string_view text);

// A boolean as Go's strconv.ParseBool reads it (upstream's flags and environment variables:
// 1 t T TRUE true True, 0 f F FALSE false False), plus yes/no/on/off in any case. Message on
// error: `invalid value "x" (want true|false)`.
Result<bool> ParseGoBool(std::string_view text);

struct PluginFlags {
  std::optional<bool> pass_device_specs;
  std::optional<std::vector<DeviceListStrategy>> device_list_strategy;  // non-empty, no duplicates
  std::optional<DeviceIdStrategy> device_id_strategy;
  std::optional<std::string> container_driver_root;
  // flags.mpsRoot (upstream's place) or flags.plugin.mpsRoot (gpulet's earlier place); when both
  // are set, flags.mpsRoot wins.
  std::optional<std::string> mps_root;
  std::optional<std::string> cdi_annotation_prefix;
  std::optional<std::string> nvidia_ctk_path;
  // Upstream's kubeletSocket: the kubelet registration socket as a full path.
  std::optional<std::string> kubelet_socket;
  // "distributed" | "packed"; gpulet's --replica-allocation-policy is an alias.
  std::optional<std::string> shared_devices_allocation_policy;
};

struct Flags {
  std::optional<MigStrategy> mig_strategy;
  std::optional<bool> fail_on_init_error;
  std::optional<std::string> nvidia_driver_root;
  std::optional<std::string> nvidia_dev_root;
  PluginFlags plugin;
  // NVIDIA's `flags.gfd` section (GPU feature discovery) is accepted and validated for key names
  // and types so shared files load, but gpulet does not use it.
  bool has_gfd_section = false;
};

// Returns `base` with every field that is set in `over` replaced by `over`'s value. For the
// precedence chain: Overlay(Overlay(file, env), cli).
Flags Overlay(Flags base, const Flags& over);

// One entry of a `devices:` list as written: an index ("0"), a MIG index ("0:1"), a GPU UUID
// ("GPU-…") or a MIG UUID ("MIG-…"). Integers in the file are stored in decimal.
struct DeviceRef {
  enum class Kind { kIndex, kMigIndex, kGpuUuid, kMigUuid };
  Kind kind = Kind::kIndex;
  std::string id;
  SourceLocation where;
};

// `devices: all` | `devices: N` (the first N GPUs, N >= 1) | `devices: [refs…]` (non-empty, no
// duplicates). Absent `devices` means all.
struct DeviceSelection {
  enum class Kind { kAll, kCount, kList };
  Kind kind = Kind::kAll;
  int count = 0;                // kCount only
  std::vector<DeviceRef> list;  // kList only
  SourceLocation where;         // of the `devices` value; line 0 when absent
};

struct ReplicatedResource {
  // Full resource names: a bare "gpu" in the file becomes "nvidia.com/gpu".
  std::string name;
  std::string rename;           // empty when not set
  SourceLocation rename_where;  // of the `rename` value; line 0 when absent
  // The name the replicas are advertised under: rename, else "<name>.shared" when the section's
  // renameByDefault is true, else name.
  std::string advertised_name;
  DeviceSelection devices;
  int replicas = 0;      // >= 2
  SourceLocation where;  // of the list entry, "sharing.timeSlicing.resources[0]"
};

// sharing.timeSlicing or sharing.mps.
struct ReplicaSharing {
  bool rename_by_default = false;
  // Unset means the strategy's default (false for time-slicing, true for MPS).
  std::optional<bool> fail_requests_greater_than_one;
  std::vector<ReplicatedResource> resources;  // non-empty
  SourceLocation where;
};

// How GetPreferredAllocation picks the GPU of a memory request: the GPU with the least free
// units that still fit (best fit, keeps large holes for large requests) or the most (spread).
enum class MemoryPlacement { kBestFit, kSpread };
const char* MemoryPlacementName(MemoryPlacement p);  // "best-fit", "spread"

// One entry of sharing.memory.resources: the GPUs of `name` that go into the memory pool.
struct MemoryPoolResource {
  std::string name;         // full name; only "nvidia.com/gpu" (whole GPUs) is accepted
  DeviceSelection devices;  // absent: all
  SourceLocation where;     // of the list entry, "sharing.memory.resources[0]"
};

// sharing.memory (gpulet's extension; NVIDIA's parser ignores the key): whole GPUs advertised as
// units of memory, one device per unit, under one resource whose name states the unit
// (docs/sharing.md, "Memory pool"). A GPU is in exactly one pool: the planner rejects a GPU
// selected here and by timeSlicing/mps.
//
//   sharing:
//     memory:
//       unit: 1Gi                 # a multiple of 1Mi (Mi, Gi, Ti or bytes); default 1Gi
//       placement: best-fit       # or spread; default best-fit
//       rename: gpulet.io/gpu-memory-1gi   # default gpulet.io/gpu-memory-<unit, lower case>
//       resources:
//         - name: nvidia.com/gpu
//           devices: all          # all | N | [indexes or UUIDs]
struct MemoryPool {
  uint64_t unit_bytes = uint64_t{1} << 30;
  SourceLocation unit_where;
  MemoryPlacement placement = MemoryPlacement::kBestFit;
  std::string advertised_name;                // rename, else DefaultMemoryResourceName(unit_bytes)
  SourceLocation rename_where;                // line 0 when not renamed
  std::vector<MemoryPoolResource> resources;  // non-empty
  SourceLocation where;
};

// 1073741824 → "1Gi", 536870912 → "512Mi" (the largest of Ti, Gi, Mi that divides it; bytes
// otherwise).
std::string UnitQuantity(uint64_t bytes);
// "gpulet.io/gpu-memory-" + the lower-cased UnitQuantity: "gpulet.io/gpu-memory-1gi".
std::string DefaultMemoryResourceName(uint64_t unit_bytes);

struct Sharing {
  // At most one of the two is set.
  std::optional<ReplicaSharing> time_slicing;
  std::optional<ReplicaSharing> mps;
  // Independent of the two: it takes other GPUs.
  std::optional<MemoryPool> memory;
};

struct Config {
  std::string version = "v1";
  std::string source;  // the filename errors name
  Flags flags;
  Sharing sharing;
  // What the file says that gpulet does not act on, one entry per key:
  // "FILE:LINE: field: problem". Callers log each once per load (LogWarnings).
  std::vector<std::string> warnings;
};

// Parses and validates `yaml_text`; `filename` is used only in error messages. An empty document
// is an error. Inputs over 1 MiB are rejected.
Result<Config> ParseConfig(std::string_view yaml_text, const std::string& filename);

// Reads `path` (kNotFound when missing or unreadable) and parses it, naming `path` in errors.
Result<Config> LoadConfigFile(const std::string& path);

// Logs each of config.warnings once, at warn level (event=config_ignored).
void LogWarnings(const Config& config);

}  // namespace gpulet::config
