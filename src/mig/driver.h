// MIG through NVML: read every GPU's MIG state and profiles, and apply a Plan.
//
// ReadMigState asks the driver for each GPU's GPU-instance profiles and their possible
// placements (nvmlDeviceGetGpuInstanceProfileInfo / ...PossiblePlacements_v2) and, with MIG on,
// for its GPU instances and their compute instances. Nothing is changed.
//
// ApplyPlan works GPU by GPU: enable MIG if needed, destroy the instances that must go (compute
// instances first), create the new ones (GPU instance at its placement, then one compute
// instance spanning it), disable MIG if asked. When a step fails, that GPU is rolled back to
// its previous layout (created instances destroyed, destroyed ones created again at the same
// placements, MIG mode restored) and ApplyPlan stops with kNvmlError naming the GPU, the step and
// the NVML error. If the rollback itself fails, the message says so: the GPU is then in a state
// that a re-run of the same apply converges from (apply is idempotent). GPUs applied before the
// failing one keep their new layout.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "gpu/nvml.h"
#include "mig/plan.h"

namespace gpulet::mig {

// Errors: kNvmlError / kGpuLost naming the GPU and the call; kNvmlSymbolMissing when the
// library lacks the MIG management functions.
Result<std::vector<GpuState>> ReadMigState(const gpu::Nvml& nvml);

// `progress` (optional) receives one line per step taken ("GPU 0: created 3g.20gb@4 (GI 2)").
Status ApplyPlan(const gpu::Nvml& nvml, const Plan& plan,
                 const std::function<void(const std::string&)>& progress = nullptr);

// "<slices>g.<GiB rounded up>gb", the way the driver and inventory name profiles.
std::string ProfileName(unsigned slices, unsigned long long memory_mb);

}  // namespace gpulet::mig
