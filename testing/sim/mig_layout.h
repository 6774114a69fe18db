// The simulated driver's MIG management, as pure functions over one GPU's layout
// (MigLayoutState). The driver runs them inside a ControlFile::Update, so a layout change made by
// one process is what every other process using the state directory sees next.
//
// Rules modelled on the driver (A100/H100/H200):
//   - MIG mode can be disabled only with no GPU instances left (NVML_ERROR_IN_USE otherwise);
//     enabling it leaves the GPU with no instances.
//   - A GPU instance is created at one of its profile's placements (fixture mig_profiles) and may
//     not overlap another's memory slices (NVML_ERROR_INSUFFICIENT_RESOURCES).
//   - GPU instance ids follow the placement (1g at start s: 7+s, 2g: 3+s/2, 3g: 1+s/4, 4g: 1,
//     7g: 0), so the same layout always gets the same ids.
//   - One compute instance per GPU instance, spanning all its slices (the mig-parted "NgXgb"
//     devices); smaller compute profiles answer NVML_ERROR_NOT_SUPPORTED.
//   - A GPU instance with compute instances cannot be destroyed (NVML_ERROR_IN_USE).
#pragma once

#include <string>
#include <vector>

#include "sim/control.h"
#include "sim/fixture.h"

namespace gpulet::sim {

// The fixture's `mig:` list as a layout (enabled when non-empty), grouped by gi.
MigLayoutState LayoutFromFixture(const std::vector<MigDeviceSpec>& mig);

// The profile with NVML profile id `id`, or null; `name` receives its mig_profiles key.
const MigProfile* FindMigProfileById(const Fixture& fixture, unsigned id, std::string* name);
// Slices of an NVML_COMPUTE_INSTANCE_PROFILE_* id; 0 for an unknown id.
unsigned ComputeProfileSlices(unsigned ci_profile);
// The compute profile spanning a whole GPU instance of `slices` (the only one simulated).
unsigned WholeComputeProfile(unsigned slices);

// The MIG devices (one per compute instance) of `layout`, ordered by gi then ci. A device whose
// gi/ci/profile is in `base` (the fixture's list) keeps that entry's UUID.
std::vector<MigDeviceSpec> MigDevicesOf(const Fixture& fixture, const GpuSpec& gpu,
                                        const std::vector<MigDeviceSpec>& base,
                                        const MigLayoutState& layout);

// Each returns an nvmlReturn_t and changes `layout` only on NVML_SUCCESS.
int SetMigModeInLayout(const GpuSpec& gpu, MigLayoutState& layout, bool enable);
int CreateGpuInstanceInLayout(const Fixture& fixture, MigLayoutState& layout, unsigned profile_id,
                              unsigned start, unsigned* gi);
int DestroyGpuInstanceInLayout(MigLayoutState& layout, unsigned gi);
int CreateComputeInstanceInLayout(const Fixture& fixture, MigLayoutState& layout, unsigned gi,
                                  unsigned ci_profile, unsigned* ci);
int DestroyComputeInstanceInLayout(MigLayoutState& layout, unsigned gi, unsigned ci);

}  // namespace gpulet::sim
