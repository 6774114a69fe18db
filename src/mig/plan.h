// MIG geometry and plans: pure functions, no NVML.
//
// A GPU model is described by its GPU instance profiles (ProfileSpec: slice count, memory, and
// the memory-slice starts the driver allows). ComputePlan turns a MigConfig and the current state
// of every GPU into a Plan: per GPU, the MIG mode change, the instances kept, destroyed and
// created (with placements). It rejects an impossible geometry before anything is touched,
// naming the GPU, the profile and why. Instances that already match are kept, so applying the
// same config twice yields an empty plan the second time.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "mig/config.h"

namespace gpulet::mig {

// Memory slices of A100/H100/H200; placements are expressed in them.
inline constexpr unsigned kMemorySlices = 8;

struct ProfileSpec {
  std::string name;  // "3g.20gb"
  unsigned id = 0;   // NVML_GPU_INSTANCE_PROFILE_*
  unsigned slices = 0;
  uint64_t memory_mb = 0;
  std::vector<unsigned> starts;  // valid placement starts
  unsigned size = 0;             // memory slices occupied
};

struct GpuInstance {
  // The device name as mig-parted writes it: a GPU instance profile ("3g.20gb", "1g.10gb+me"),
  // or a compute-instance profile ("1c.3g.20gb": one 1-slice compute instance in a 3g.20gb).
  std::string profile;
  unsigned start = 0;
  std::optional<unsigned> gi;  // set for an existing instance
  // An existing instance counts as a mig-parted device only with exactly one compute instance
  // (spanning it, or of the slices its name says); anything else is destroyed and created again.
  bool whole_ci = true;
  bool operator==(const GpuInstance&) const = default;
};

struct GpuState {
  unsigned index = 0;
  std::string name;
  std::string uuid;
  uint32_t pci_device_id = 0;  // NVML's pciDeviceId, e.g. 0x233010DE (device-filter matches it)
  bool mig_capable = false;
  bool mig_enabled = false;
  std::vector<ProfileSpec> profiles;
  std::vector<GpuInstance> instances;
};

struct GpuPlan {
  unsigned index = 0;
  std::string name;
  bool mig_before = false, mig_after = false;
  std::vector<GpuInstance> keep, destroy, create;
  bool changes() const { return mig_before != mig_after || !destroy.empty() || !create.empty(); }
};

struct Plan {
  std::string config;         // the config name
  std::vector<GpuPlan> gpus;  // only the GPUs the config names
  bool changes() const;
};

// Places `want` (profile → count) next to `fixed` on a GPU with `profiles`. Returns the new
// instances (fixed ones excluded), or kInvalidInput "<profile> x<count>: <why>".
Result<std::vector<GpuInstance>> PlaceInstances(
    const std::vector<ProfileSpec>& profiles, const std::vector<GpuInstance>& fixed,
    const std::vector<std::pair<std::string, unsigned>>& want);

// Errors (kInvalidInput): "FILE:LINE: FIELD: GPU 3 (NVIDIA A100-SXM4-40GB): …" for a device
// index that does not exist, a GPU without MIG, an unknown profile or a geometry that does not fit.
Result<Plan> ComputePlan(const MigConfig& config, const std::vector<GpuState>& gpus);

nlohmann::json PlanToJson(const Plan& plan);
// One line per GPU and change, for people.
std::string PlanToText(const Plan& plan);

}  // namespace gpulet::mig
