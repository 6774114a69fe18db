#include "deviceplugin/test_inventories.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <stdexcept>

namespace gpulet::deviceplugin::testing {
namespace {

gpu::Inventory Make(unsigned n, const std::function<int(unsigned)>& numa,
                    const std::function<int(unsigned)>& pcie_switch,
                    const std::function<unsigned(unsigned, unsigned)>& nvlinks) {
  gpu::Inventory inv;
  inv.driver_version = "550.54.15";
  for (unsigned i = 0; i < n; ++i) {
    gpu::Gpu g;
    g.index = i;
    g.minor = i;
    char uuid[64];
    std::snprintf(uuid, sizeof(uuid), "GPU-%08x-0000-0000-0000-%012u", 0xabc00000u + i, i);
    g.uuid = uuid;
    g.name = "Test GPU";
    g.numa_node = numa(i);
    inv.gpus.push_back(g);
  }
  inv.links.assign(n, std::vector<gpu::Link>(n));
  for (unsigned a = 0; a < n; ++a) {
    for (unsigned b = 0; b < n; ++b) {
      if (a == b) continue;
      gpu::Link& l = inv.links[a][b];
      l.nvlinks = nvlinks(a, b);
      if (pcie_switch(a) >= 0 && pcie_switch(a) == pcie_switch(b)) {
        l.pcie = gpu::PcieRelation::kSameSwitch;
      } else if (numa(a) == numa(b)) {
        l.pcie = gpu::PcieRelation::kSameCpu;
      } else {
        l.pcie = gpu::PcieRelation::kCrossCpu;
      }
    }
  }
  return inv;
}

}  // namespace

gpu::Inventory DgxH100Like() {
  return Make(
      8, [](unsigned i) { return i < 4 ? 0 : 1; }, [](unsigned) { return -1; },
      [](unsigned, unsigned) { return 18u; });
}

gpu::Inventory L4PcieLike() {
  return Make(
      4, [](unsigned i) { return i < 2 ? 0 : 1; },
      [](unsigned i) { return static_cast<int>(i / 2); }, [](unsigned, unsigned) { return 0u; });
}

gpu::Inventory PartialNvlink() {
  return Make(
      4, [](unsigned) { return 0; }, [](unsigned i) { return static_cast<int>(i / 2); },
      [](unsigned a, unsigned b) {
        if (a > b) std::swap(a, b);
        if ((a == 0 && b == 2) || (a == 1 && b == 3)) return 4u;
        if ((a == 0 && b == 1) || (a == 2 && b == 3)) return 1u;
        return 0u;
      });
}

gpu::Inventory Synthetic(unsigned n) {
  const unsigned per_node = std::max(1u, n / 4);
  return Make(
      n, [per_node](unsigned i) { return static_cast<int>(i / per_node); },
      [](unsigned i) { return static_cast<int>(i / 2); }, [](unsigned, unsigned) { return 0u; });
}

sharing::Resource GpuResource(const gpu::Inventory& inventory) {
  config::Config cfg;
  Result<sharing::Plan> plan = sharing::BuildPlan(inventory, cfg);
  if (!plan.ok() || plan->resources.empty()) throw std::runtime_error("test plan failed");
  return plan->resources.front();
}

}  // namespace gpulet::deviceplugin::testing
