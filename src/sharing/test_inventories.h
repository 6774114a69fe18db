// Hand-built inventories for sharing tests and benchmarks (no discovery, no gtest dependency).
#pragma once

#include <string>
#include <vector>

#include "gpu/inventory.h"

namespace gpulet::sharing::testing {

// `n` whole GPUs of compute capability cc_major.cc_minor, `memory_mib` each, NVSwitch between all
// (nvlinks 12), GPUs 0..n/2-1 on NUMA 0 and the rest on NUMA 1. UUIDs "GPU-<i>", minor = index.
gpu::Inventory WholeGpus(unsigned n, int cc_major = 9, int cc_minor = 0,
                         uint64_t memory_mib = 81559);

// Shaped like the dgx-a100 fixture: 8 × A100 40GB (cc 8.0); GPU 0 in MIG mode with 3g.20gb,
// 2g.10gb, 1g.5gb, 1g.5gb; GPU 1 with 7 × 1g.5gb; GPUs 2-7 without MIG. MIG UUIDs
// "MIG-<gpu>-<mig>", capability nodes /dev/nvidia-caps/nvidia-cap<gpu*100+mig*2+{1,2}>.
gpu::Inventory A100Mixed();

// `gpus` GPUs, each in MIG mode with `profiles` (in MIG index order).
gpu::Inventory MigEverywhere(unsigned gpus, const std::vector<std::string>& profiles);

}  // namespace gpulet::sharing::testing
