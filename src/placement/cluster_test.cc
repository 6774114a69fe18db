#include "placement/cluster.h"

#include <gtest/gtest.h>

#include "placement/test_clusters.h"

namespace gpulet::placement {
namespace {

using testing::MakeNode;
using testing::MakePod;

TEST(Fits, ChecksCpuMemoryModelAndGpuShares) {
  Node n = MakeNode("n", 0, 8000, {1000, 300});
  EXPECT_TRUE(Fits(n, MakePod(8000, 1, 1000)));
  EXPECT_FALSE(Fits(n, MakePod(8001, 1, 1000)));  // CPU
  EXPECT_TRUE(Fits(n, MakePod(1000, 1, 300)));
  EXPECT_FALSE(Fits(n, MakePod(1000, 2, 1000)));  // one whole GPU only
  EXPECT_TRUE(Fits(n, MakePod(1000, 0, 0)));      // CPU only
  Pod big_memory = MakePod(1000, 1, 100);
  big_memory.memory_mib = n.memory_free + 1;
  EXPECT_FALSE(Fits(n, big_memory));  // memory
  Pod other_model = MakePod(1000, 1, 100);
  other_model.model_constrained = true;
  other_model.model_mask = 0b10;
  EXPECT_FALSE(Fits(n, other_model));  // GPU model
  other_model.model_mask = 0b11;
  EXPECT_TRUE(Fits(n, other_model));
  EXPECT_FALSE(Fits(MakeNode("cpu", 0, 8000, {}), MakePod(1000, 1, 100)));
}

TEST(BestFitGpus, SharingPodTakesTheLeastSufficientGpuWholePodsTakeFreeGpus) {
  Node n = MakeNode("n", 0, 8000, {1000, 400, 700, 1000, 400});
  EXPECT_EQ(BestFitGpus(n, MakePod(1, 1, 350)), GpuSet{1} << 1);  // 400, lowest index
  EXPECT_EQ(BestFitGpus(n, MakePod(1, 1, 500)), GpuSet{1} << 2);  // 700
  EXPECT_EQ(BestFitGpus(n, MakePod(1, 2, 1000)), GpuSet{0b01001});
  EXPECT_EQ(BestFitGpus(n, MakePod(1, 3, 1000)), GpuSet{0});
  EXPECT_EQ(BestFitGpus(n, MakePod(1, 0, 0)), GpuSet{0});
}

TEST(Apply, TakesResourcesAndCountsThePodClass) {
  Cluster c;
  c.nodes.push_back(MakeNode("n", 0, 8000, {1000, 1000}));
  Node& n = c.nodes[0];
  Apply(n, MakePod(3000, 1, 250), GpuSet{0b10});
  Apply(n, MakePod(1000, 1, 1000), GpuSet{0b01});
  EXPECT_EQ(n.cpu_free, 4000);
  EXPECT_EQ(n.gpu_free, (std::vector<int32_t>{0, 750}));
  EXPECT_EQ(n.pods_by_class[0], 1);
  EXPECT_EQ(n.pods_by_class[1], 1);
  EXPECT_EQ(c.GpuCapacityMilli(), 2000);
  EXPECT_EQ(c.GpuAllocatedMilli(), 1250);
}

TEST(Cluster, InternsModels) {
  Cluster c;
  EXPECT_EQ(c.InternModel("T4"), 0);
  EXPECT_EQ(c.InternModel("G2"), 1);
  EXPECT_EQ(c.InternModel("T4"), 0);
  EXPECT_EQ(c.FindModel("G2"), 1);
  EXPECT_EQ(c.FindModel("A100"), -1);
}

}  // namespace
}  // namespace gpulet::placement
