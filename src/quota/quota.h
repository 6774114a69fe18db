// "Quota first": per-tenant GPU budgets rendered as ResourceQuota + LimitRange manifests, checked
// against the fleet's inventory (files written by `gpulet info --output json`).
//
// Tenants file (YAML):
//   tenants:
//     - namespace: team-a        # DNS-1123 label, unique
//       gpus: 4                  # requests.nvidia.com/gpu (whole GPUs)
//       sharedGpus: 8            # requests.nvidia.com/gpu.shared (time-sliced / MPS replicas)
//       mig: {1g.10gb: 7}        # requests.nvidia.com/mig-1g.10gb (+me profiles as .me)
//       gpuMemory: 160           # requests.<memoryResource>: units of GPU memory
//       (docs/memory-requests.md) maxPerContainer: 2       # optional cap per container for each
//       GPU count above
//   memoryResource: gpulet.io/gpu-memory-1gi   # optional, the memory pool's resource (unit in
//   name)
// Every count is an integer >= 0; unknown keys are errors. Errors are kInvalidInput with
// "FILE:LINE: field: problem".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace gpulet::quota {

struct Tenant {
  std::string namespace_name;
  int gpus = 0;
  int shared_gpus = 0;
  std::map<std::string, int> mig;          // profile as in the inventory ("1g.10gb", "1g.10gb+me")
  int gpu_memory = 0;                      // units of the memory resource
  int max_per_container = 0;               // 0: no LimitRange max
  int line = 0;                            // of the entry, for errors
  std::map<std::string, int> field_lines;  // "gpus", "sharedGpus", "mig.<profile>" → line
};

struct TenantsFile {
  std::string path;
  std::vector<Tenant> tenants;
  int tenants_line = 0;
  std::string memory_resource = "gpulet.io/gpu-memory-1gi";
  int64_t memory_unit_bytes = int64_t{1} << 30;
};

// The unit a memory resource name states: "gpulet.io/gpu-memory-512mi" → 512 MiB. kInvalidInput
// for a name that is not gpulet.io/gpu-memory-<n>(ki|mi|gi).
Result<int64_t> MemoryUnitBytes(const std::string& resource);

Result<TenantsFile> ParseTenants(const std::string& yaml_text, const std::string& path);
Result<TenantsFile> LoadTenants(const std::string& path);

// What a fleet can grant, summed over its inventory files.
struct FleetCapacity {
  int whole_gpus = 0;                         // GPUs without MIG
  std::vector<int64_t> whole_gpu_memory_mib;  // per GPU without MIG
  std::map<std::string, int> mig;             // profile → MIG devices
  std::vector<std::string> sources;           // files read
};

// Adds one `gpulet info --output json` file. kInvalidInput "FILE:LINE:
// gpus[2].mig_devices[0].profile: …".
Status AddInventory(FleetCapacity& fleet, const std::string& json_text, const std::string& path);
Status LoadInventory(FleetCapacity& fleet, const std::string& path);

// "nvidia.com/mig-1g.10gb" for "1g.10gb"; "+me" becomes ".me".
std::string MigResourceName(const std::string& profile);

struct CheckOptions {
  // Time-slicing/MPS replicas per shared GPU; 0 = do not check sharedGpus against the fleet.
  int shared_replicas = 0;
  bool allow_overcommit = false;  // sums over capacity become warnings
};

struct CheckReport {
  std::vector<std::string> warnings;
};

// Sums every budget and compares it with the fleet; also rejects MIG profiles the fleet lacks.
// kInvalidInput naming the tenants file, line and field.
Result<CheckReport> CheckAgainstFleet(const TenantsFile& tenants, const FleetCapacity& fleet,
                                      const CheckOptions& options);

// The manifests, one YAML document per object: per tenant a ResourceQuota "gpu-quota" and, when
// maxPerContainer is set, a ValidatingAdmissionPolicy "gpulet-gpu-cap-<namespace>" with its
// binding, which rejects a container asking for more than the cap of a budgeted resource and
// leaves containers asking for none alone. No LimitRange: its `max` would make the LimitRanger
// require a limit for that resource on every container of the namespace.
std::string RenderManifests(const TenantsFile& tenants);

}  // namespace gpulet::quota
