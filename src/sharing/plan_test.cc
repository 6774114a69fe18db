#include "sharing/plan.h"

#include <gtest/gtest.h>

namespace gpulet::sharing {
namespace {

gpu::Inventory ThreeGpus() {
  gpu::Inventory inv;
  for (unsigned i : {2u, 0u, 1u}) {  // discovery order need not be index order
    gpu::Gpu g;
    g.index = i;
    g.uuid = "GPU-" + std::to_string(i);
    if (i != 1) g.numa_node = static_cast<int>(i / 2);
    inv.gpus.push_back(g);
  }
  inv.links.assign(3, std::vector<gpu::Link>(3));
  return inv;
}

TEST(SocketNameTest, Names) {
  EXPECT_EQ(SocketNameFor("nvidia.com/gpu"), "nvidia-gpu.sock");
  EXPECT_EQ(SocketNameFor("nvidia.com/gpu.shared"), "nvidia-gpu.shared.sock");
  EXPECT_EQ(SocketNameFor("nvidia.com/mig-1g.10gb"), "nvidia-mig-1g.10gb.sock");
}

TEST(BuildPlanTest, WholeGpusByDefault) {
  config::Config cfg;
  Result<Plan> plan = BuildPlan(ThreeGpus(), cfg);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->resources.size(), 1u);
  const Resource& r = plan->resources[0];
  EXPECT_EQ(r.name, "nvidia.com/gpu");
  EXPECT_EQ(r.socket_name, "nvidia-gpu.sock");
  EXPECT_EQ(r.replicas, 1);
  ASSERT_EQ(r.devices.size(), 3u);
  for (unsigned i = 0; i < 3; ++i) {
    const AdvertisedDevice& d = r.devices[i];
    EXPECT_EQ(d.id, "GPU-" + std::to_string(i));
    EXPECT_EQ(d.uuid, d.id);
    EXPECT_EQ(d.index, std::to_string(i));
    EXPECT_EQ(d.gpu_index, i);
    EXPECT_EQ(d.replica, -1);
    EXPECT_FALSE(d.mig_index.has_value());
  }
  EXPECT_EQ(r.devices[0].numa_node, 0);
  EXPECT_FALSE(r.devices[1].numa_node.has_value());
  EXPECT_EQ(r.devices[2].numa_node, 1);
  EXPECT_EQ(plan->Find("nvidia.com/gpu"), &plan->resources[0]);
  EXPECT_EQ(r.Find("GPU-2"), &r.devices[2]);
  EXPECT_EQ(r.Find("GPU-9"), nullptr);
}

TEST(BuildPlanTest, IdStrategyDoesNotChangeAdvertisedIds) {
  config::Config uuid_cfg, index_cfg;
  index_cfg.flags.plugin.device_id_strategy = config::DeviceIdStrategy::kIndex;
  Result<Plan> a = BuildPlan(ThreeGpus(), uuid_cfg);
  Result<Plan> b = BuildPlan(ThreeGpus(), index_cfg);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->resources, b->resources);
}

TEST(BuildPlanTest, NoGpusNoResources) {
  Result<Plan> plan = BuildPlan(gpu::Inventory{}, config::Config{});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->resources.empty());
}

TEST(BuildPlanTest, UnsupportedStrategiesAreClearErrors) {
  config::Config mig;
  mig.source = "cfg.yaml";
  mig.flags.mig_strategy = config::MigStrategy::kMixed;
  Result<Plan> p = BuildPlan(ThreeGpus(), mig);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), ErrorCode::kInvalidInput);
  EXPECT_NE(p.status().message().find("flags.migStrategy"), std::string::npos);

  config::Config ts;
  ts.sharing.time_slicing = config::ReplicaSharing{};
  ts.sharing.time_slicing->where = {"cfg.yaml", 3, "sharing.timeSlicing"};
  p = BuildPlan(ThreeGpus(), ts);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("cfg.yaml:3: sharing.timeSlicing"), std::string::npos);
}

}  // namespace
}  // namespace gpulet::sharing
