// Facts of NVML's MIG profile ids shared by gpulet's MIG code and the simulated driver.
#pragma once

#include "gpu/nvml_api.h"

namespace gpulet::gpu {

// The compute-instance profile that spans a whole GPU instance of `slices` slices (one compute
// instance per GPU instance, as mig-parted creates them).
inline unsigned WholeComputeProfile(unsigned slices) {
  switch (slices) {
    case 1: return NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE;
    case 2: return NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE;
    case 3: return NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE;
    case 4: return NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE;
    case 6: return NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE;
    case 8: return NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE;
    default: return NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE;
  }
}

}  // namespace gpulet::gpu
