#include "sharing/test_inventories.h"

namespace gpulet::sharing::testing {

gpu::Inventory WholeGpus(unsigned n, int cc_major, int cc_minor, uint64_t memory_mib) {
  gpu::Inventory inv;
  inv.driver_version = "550.54.15";
  inv.cuda_version = "12.4";
  for (unsigned i = 0; i < n; ++i) {
    gpu::Gpu g;
    g.index = i;
    g.minor = i;
    g.uuid = "GPU-" + std::to_string(i);
    g.name = "Test GPU";
    g.memory_mib = memory_mib;
    g.cc_major = cc_major;
    g.cc_minor = cc_minor;
    g.numa_node = i < (n + 1) / 2 ? 0 : 1;
    g.mig_capable = cc_major >= 8;
    inv.gpus.push_back(g);
  }
  inv.links.assign(n, std::vector<gpu::Link>(n));
  for (unsigned a = 0; a < n; ++a) {
    for (unsigned b = 0; b < n; ++b) {
      if (a == b) continue;
      inv.links[a][b].nvlinks = 12;
      inv.links[a][b].pcie = inv.gpus[a].numa_node == inv.gpus[b].numa_node
                                 ? gpu::PcieRelation::kSameCpu
                                 : gpu::PcieRelation::kCrossCpu;
    }
  }
  return inv;
}

namespace {

void EnableMig(gpu::Gpu& g, const std::vector<std::string>& profiles) {
  g.mig_enabled = true;
  for (unsigned m = 0; m < profiles.size(); ++m) {
    gpu::MigDevice d;
    d.parent_index = g.index;
    d.mig_index = m;
    d.uuid = "MIG-" + std::to_string(g.index) + "-" + std::to_string(m);
    d.profile = profiles[m];
    d.gpu_instance_id = m + 1;
    d.memory_mib = 4864;
    const unsigned cap = g.index * 100 + m * 2;
    d.gi_cap_path = "/dev/nvidia-caps/nvidia-cap" + std::to_string(cap + 1);
    d.ci_cap_path = "/dev/nvidia-caps/nvidia-cap" + std::to_string(cap + 2);
    g.mig_devices.push_back(d);
  }
}

}  // namespace

gpu::Inventory A100Mixed() {
  gpu::Inventory inv = WholeGpus(8, 8, 0, 40960);
  EnableMig(inv.gpus[0], {"3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"});
  EnableMig(inv.gpus[1], std::vector<std::string>(7, "1g.5gb"));
  return inv;
}

gpu::Inventory MigEverywhere(unsigned gpus, const std::vector<std::string>& profiles) {
  gpu::Inventory inv = WholeGpus(gpus, 9, 0, 81559);
  for (gpu::Gpu& g : inv.gpus) EnableMig(g, profiles);
  return inv;
}

}  // namespace gpulet::sharing::testing
