#include "placement/fragmentation.h"

#include <gtest/gtest.h>

#include "placement/test_clusters.h"

namespace gpulet::placement {
namespace {

using testing::MakeNode;
using testing::MakePod;

TypicalPod Shape(int64_t cpu, int32_t num_gpu, int32_t milli, double p) {
  TypicalPod t;
  t.cpu_milli = cpu;
  t.num_gpu = num_gpu;
  t.gpu_milli = milli;
  t.probability = p;
  return t;
}

// Half the pods want 0.5 GPU, a quarter a whole GPU, a quarter no GPU; each 1 CPU.
TypicalPods Mixed() {
  return TypicalPods::FromList(
      {Shape(1000, 1, 500, 0.5), Shape(1000, 1, 1000, 0.25), Shape(1000, 0, 0, 0.25)});
}

TEST(Fragmentation, HandComputedMixedWorkload) {
  // Free [1000, 300] = 1300. 0.5-GPU pod fits (GPU 0): fragment 300 (GPU 1 < 500).
  // Whole-GPU pod fits: fragment 300. CPU-only pod: everything, 1300.
  // F = 0.5*300 + 0.25*300 + 0.25*1300 = 550.
  EXPECT_DOUBLE_EQ(Mixed().Fragmentation(MakeNode("n", 0, 10000, {1000, 300})), 550);
  // Free [400, 300]: no GPU pod fits; all 700 is fragment for every typical pod.
  EXPECT_DOUBLE_EQ(Mixed().Fragmentation(MakeNode("n", 0, 10000, {400, 300})), 700);
  // Free [600, 1000]: 0.5-GPU pod fragments nothing, whole-GPU pod 600, CPU-only 1600:
  // 0 + 150 + 400.
  EXPECT_DOUBLE_EQ(Mixed().Fragmentation(MakeNode("n", 0, 10000, {600, 1000})), 550);
  // An empty 8-GPU node: only the CPU-only share of the distribution, 0.25 * 8000.
  EXPECT_DOUBLE_EQ(Mixed().Fragmentation(
                       MakeNode("n", 0, 10000, {1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000})),
                   2000);
  // A full node has nothing to fragment.
  EXPECT_DOUBLE_EQ(Mixed().Fragmentation(MakeNode("n", 0, 10000, {0, 0})), 0);
}

TEST(Fragmentation, NodeWithoutCpuForThePodsIsAllFragment) {
  EXPECT_DOUBLE_EQ(Mixed().Fragmentation(MakeNode("n", 0, 999, {1000, 300})), 1300);
}

TEST(Fragmentation, OnlyThePodsThatGetTheirCpuCount) {
  // 0.5-GPU pods: half need 1 CPU, half 5 CPUs. Free [1000, 300] = 1300; a pod that fits leaves
  // 300 fragmented, one that lacks CPU all 1300.
  TypicalPods t = TypicalPods::FromList({Shape(1000, 1, 500, 0.5), Shape(5000, 1, 500, 0.5)});
  EXPECT_DOUBLE_EQ(t.Fragmentation(MakeNode("n", 0, 3000, {1000, 300})), 0.5 * 300 + 0.5 * 1300);
  EXPECT_DOUBLE_EQ(t.Fragmentation(MakeNode("n", 0, 5000, {1000, 300})), 300);
  EXPECT_DOUBLE_EQ(t.Fragmentation(MakeNode("n", 0, 999, {1000, 300})), 1300);
}

TEST(Fragmentation, GpuModelConstraint) {
  TypicalPods t = TypicalPods::FromList({Shape(1000, 1, 500, 0.5), Shape(1000, 1, 1000, 0.5)});
  std::vector<TypicalPod> pods = t.pods();
  pods[0].model_constrained = true;
  pods[0].model_mask = 0b10;  // model 1 only
  TypicalPods constrained = TypicalPods::FromList(pods);
  // On model 0 the 0.5-GPU pod finds nothing: 0.5*1300 + 0.5*300 = 800.
  EXPECT_DOUBLE_EQ(constrained.Fragmentation(MakeNode("n", 0, 10000, {1000, 300})), 800);
  // On model 1 it fits: 0.5*300 + 0.5*300 = 300.
  EXPECT_DOUBLE_EQ(constrained.Fragmentation(MakeNode("n", 1, 10000, {1000, 300})), 300);
}

TEST(Fragmentation, MultiGpuPodNeedsEnoughWholeGpus) {
  TypicalPods t = TypicalPods::FromList({Shape(1000, 2, 1000, 1)});
  EXPECT_DOUBLE_EQ(t.Fragmentation(MakeNode("n", 0, 10000, {1000, 1000, 600})), 600);
  EXPECT_DOUBLE_EQ(t.Fragmentation(MakeNode("n", 0, 10000, {1000, 600, 600})), 2200);
}

TEST(TypicalPods, MostFrequentShapesUpToCoverageRenormalised) {
  std::vector<Pod> pods;
  for (int i = 0; i < 10; ++i) pods.push_back(MakePod(1000, 1, 500));
  for (int i = 0; i < 6; ++i) pods.push_back(MakePod(2000, 1, 1000));
  for (int i = 0; i < 3; ++i) pods.push_back(MakePod(4000, 0, 0));
  pods.push_back(MakePod(8000, 8, 1000));
  TypicalPods t = TypicalPods::FromWorkload(pods, 0.95);  // 19 of 20 pods: the first three shapes
  ASSERT_EQ(t.pods().size(), 3U);
  EXPECT_EQ(t.pods()[0].gpu_milli, 500);
  EXPECT_DOUBLE_EQ(t.pods()[0].probability, 10.0 / 19);
  EXPECT_DOUBLE_EQ(t.pods()[1].probability, 6.0 / 19);
  EXPECT_EQ(t.pods()[2].num_gpu, 0);
  EXPECT_DOUBLE_EQ(t.pods()[2].probability, 3.0 / 19);
  EXPECT_EQ(TypicalPods::FromWorkload(pods, 0.5).pods().size(), 1U);
  EXPECT_EQ(TypicalPods::FromWorkload(pods, 1.0).pods().size(), 4U);
}

}  // namespace
}  // namespace gpulet::placement
