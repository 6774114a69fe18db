// Hand-built inventories shaped like the simulated fixtures, for unit tests that must not depend
// on discovery: NVSwitch (dgx-h100), PCIe switch pairs (l4-pcie), partial NVLink, and N GPUs.
#pragma once

#include "gpu/inventory.h"
#include "sharing/plan.h"

namespace gpulet::deviceplugin::testing {

// 8 GPUs, NV18 between every pair, GPUs 0-3 on NUMA 0 and 4-7 on NUMA 1.
gpu::Inventory DgxH100Like();
// 4 GPUs, no NVLink; 0,1 behind one PCIe switch on NUMA 0, 2,3 behind another on NUMA 1.
gpu::Inventory L4PcieLike();
// 4 GPUs on one NUMA node: NV4 between 0-2 and 1-3, NV1 between 0-1 and 2-3, none otherwise;
// 0,1 share a PCIe switch and so do 2,3.
gpu::Inventory PartialNvlink();
// n GPUs, no NVLink, two per PCIe switch, n/4 per NUMA node (4 nodes).
gpu::Inventory Synthetic(unsigned n);

// The whole-GPU `nvidia.com/gpu` resource of the inventory, via sharing::BuildPlan.
sharing::Resource GpuResource(const gpu::Inventory& inventory);

}  // namespace gpulet::deviceplugin::testing
