#include "gpu/inventory.h"

#include <gtest/gtest.h>

#include <set>

#include "gpu/inventory_json.h"
#include "sim/sim_node.h"

namespace gpulet::gpu {
namespace {

Inventory DiscoverFixture(const std::string& fixture) {
  Result<testing::SimNode> node = testing::OpenSimNode(fixture);
  EXPECT_TRUE(node.ok()) << node.status().message();
  if (!node.ok()) return {};
  Result<Inventory> inv = Discover(*node->nvml, node->options);
  EXPECT_TRUE(inv.ok()) << inv.status().message();
  return inv.ok() ? *inv : Inventory{};
}

TEST(Discover, DgxH100HasEightHopperGpusWithAFullNvlinkMesh) {
  Inventory inv = DiscoverFixture("dgx-h100");
  ASSERT_EQ(inv.gpus.size(), 8u);
  EXPECT_FALSE(inv.driver_version.empty());
  EXPECT_FALSE(inv.cuda_version.empty());
  std::set<std::string> uuids;
  std::set<int> numa;
  for (const Gpu& g : inv.gpus) {
    EXPECT_EQ(g.name, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(g.memory_mib, 81559u);
    EXPECT_EQ(g.compute_capability(), "9.0");
    EXPECT_EQ(g.architecture, "hopper");
    EXPECT_EQ(g.uuid.rfind("GPU-", 0), 0u) << g.uuid;
    EXPECT_EQ(g.pci_bus_id.size(), 16u) << g.pci_bus_id;
    ASSERT_TRUE(g.numa_node.has_value()) << "GPU " << g.index;
    numa.insert(*g.numa_node);
    EXPECT_FALSE(g.cpu_affinity.empty());
    EXPECT_FALSE(g.mig_enabled);
    uuids.insert(g.uuid);
  }
  EXPECT_EQ(uuids.size(), 8u) << "UUIDs must be unique";
  EXPECT_EQ(numa.size(), 2u);
  for (unsigned i = 0; i < 8; ++i) {
    for (unsigned j = 0; j < 8; ++j) {
      if (i != j) {
        EXPECT_EQ(inv.NvlinkCount(i, j), 18u) << i << "-" << j;
      }
    }
  }
  EXPECT_EQ(inv.FindByUuid(inv.gpus[5].uuid), &inv.gpus[5]);
}

TEST(Discover, DgxA100ReportsMixedMigGeometryWithCapabilityNodes) {
  Inventory inv = DiscoverFixture("dgx-a100");
  ASSERT_EQ(inv.gpus.size(), 8u);
  EXPECT_EQ(inv.NvlinkCount(0, 7), 12u);
  const Gpu& g0 = inv.gpus[0];
  const Gpu& g1 = inv.gpus[1];
  EXPECT_TRUE(g0.mig_capable);
  EXPECT_TRUE(g0.mig_enabled);
  EXPECT_TRUE(g1.mig_enabled);
  EXPECT_FALSE(inv.gpus[2].mig_enabled);
  std::multiset<std::string> p0;
  for (const MigDevice& m : g0.mig_devices) {
    p0.insert(m.profile);
    EXPECT_EQ(m.uuid.rfind("MIG-", 0), 0u);
    EXPECT_EQ(m.parent_index, 0u);
    EXPECT_EQ(m.gi_cap_path.rfind("/dev/nvidia-caps/nvidia-cap", 0), 0u) << m.gi_cap_path;
    EXPECT_EQ(m.ci_cap_path.rfind("/dev/nvidia-caps/nvidia-cap", 0), 0u) << m.ci_cap_path;
    EXPECT_NE(m.gi_cap_path, m.ci_cap_path);
    EXPECT_GT(m.sm_count, 0u);
  }
  EXPECT_EQ(p0, (std::multiset<std::string>{"3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"}));
  ASSERT_EQ(g1.mig_devices.size(), 7u);
  for (const MigDevice& m : g1.mig_devices) {
    EXPECT_EQ(m.profile, "1g.5gb");
    EXPECT_EQ(m.memory_mib, 4864u);
  }
  EXPECT_EQ(inv.MigDeviceCount(), 11u);
  EXPECT_EQ(inv.FindMigByUuid(g1.mig_devices[3].uuid), &g1.mig_devices[3]);
}

TEST(Discover, L4PcieHasNoNvlinkAndPcieRelationsFollowSwitchesAndSockets) {
  Inventory inv = DiscoverFixture("l4-pcie");
  ASSERT_EQ(inv.gpus.size(), 4u);
  for (unsigned i = 0; i < 4; ++i) {
    EXPECT_EQ(inv.gpus[i].architecture, "ada");
    for (unsigned j = 0; j < 4; ++j) {
      if (i != j) {
        EXPECT_EQ(inv.NvlinkCount(i, j), 0u);
      }
    }
  }
  // Two GPUs per switch, the two switches on different sockets.
  EXPECT_EQ(inv.links[0][1].pcie, PcieRelation::kSameSwitch);
  EXPECT_EQ(inv.links[2][3].pcie, PcieRelation::kSameSwitch);
  EXPECT_EQ(inv.links[0][2].pcie, PcieRelation::kCrossCpu);
  EXPECT_NE(inv.gpus[0].numa_node, inv.gpus[3].numa_node);
}

TEST(Discover, NumaNodeIsAbsentWhenSysfsDoesNotKnowTheDevice) {
  Result<testing::SimNode> node = testing::OpenSimNode("l4-pcie");
  ASSERT_TRUE(node.ok()) << node.status().message();
  DiscoverOptions options = node->options;
  options.sysfs_root = testing::MakeTempDir();  // empty tree
  Result<Inventory> inv = Discover(*node->nvml, options);
  ASSERT_TRUE(inv.ok()) << inv.status().message();
  for (const Gpu& g : inv->gpus) {
    EXPECT_FALSE(g.numa_node.has_value());
    EXPECT_TRUE(g.cpu_affinity.empty());
  }
}

TEST(InventoryJson, ListsEveryGpuWithUuidMemoryAndTheNvlinkMatrix) {
  Inventory inv = DiscoverFixture("dgx-h100");
  nlohmann::json j = ToJson(inv);
  ASSERT_EQ(j["gpus"].size(), 8u);
  EXPECT_EQ(j["gpu_count"], 8);
  EXPECT_EQ(j["gpus"][3]["uuid"], inv.gpus[3].uuid);
  EXPECT_EQ(j["gpus"][3]["memory_mib"], 81559);
  EXPECT_EQ(j["nvlink_matrix"][2][5], 18);
  EXPECT_EQ(j["nvlink_matrix"][4][4], 0);
  EXPECT_EQ(j["gpus"][0]["links"].size(), 7u);
}

}  // namespace
}  // namespace gpulet::gpu
