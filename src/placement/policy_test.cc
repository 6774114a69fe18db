#include "placement/policy.h"

#include <gtest/gtest.h>

#include <map>

#include "placement/test_clusters.h"

namespace gpulet::placement {
namespace {

using testing::MakeNode;
using testing::MakePod;

TypicalPods OnlyShape(int32_t num_gpu, int32_t milli) {
  TypicalPod t;
  t.cpu_milli = 1000;
  t.num_gpu = num_gpu;
  t.gpu_milli = milli;
  t.probability = 1;
  return TypicalPods::FromList({t});
}

struct Picked {
  std::string node;
  GpuSet gpus = 0;
};

Picked Pick(const std::string& policy, const Cluster& c, const Pod& pod,
            const TypicalPods& typical = {}) {
  std::unique_ptr<Policy> p = MakePolicy(policy, typical);
  EXPECT_NE(p, nullptr) << policy;
  Rng rng(1);
  std::optional<Decision> d = Choose(c, pod, *p, rng);
  if (!d) return {"(none)", 0};
  return {c.nodes[d->node].name, d->choice.gpus};
}

TEST(Policies, KnowTheirNames) {
  for (const std::string& name : PolicyNames()) {
    std::unique_ptr<Policy> p = MakePolicy(name, OnlyShape(1, 1000));
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->Name(), name);
  }
  EXPECT_EQ(MakePolicy("firstfit", {}), nullptr);
}

TEST(Policies, NoPolicyPlacesWhereThePodDoesNotFit) {
  Cluster c;
  c.nodes.push_back(MakeNode("small", 0, 64000, {1000}));
  c.nodes.push_back(MakeNode("nocpu", 0, 100, {1000, 1000}));
  for (const std::string& name : PolicyNames()) {
    EXPECT_EQ(Pick(name, c, MakePod(1000, 2, 1000), OnlyShape(1, 1000)).node, "(none)") << name;
    EXPECT_EQ(Pick(name, c, MakePod(1000, 1, 1000), OnlyShape(1, 1000)).node, "small") << name;
  }
}

// A 0.4-GPU pod; the typical pods want 0.6 GPU. "empty" has one free GPU; "halves" has two GPUs
// half used and one free.
//  - bestfit: least leftover: empty (0.6 GPU left) over halves (1.6 left).
//  - gpupacking: an already shared GPU first: halves, on a half-used GPU.
//  - fgd: on halves GPU 0 the 0.5 left (useless to a 0.6 pod, fragment) becomes 0.1: the node's
//    fragmentation falls from 1000 to 600; on empty it stays 0. So halves, GPU 0.
TEST(Policies, SharingPodBestFitAvoidsTheUsedNodePackingAndFgdTakeIt) {
  Cluster c;
  c.nodes.push_back(MakeNode("empty", 0, 32000, {1000}));
  c.nodes.push_back(MakeNode("halves", 0, 32000, {500, 500, 1000}));
  const Pod pod = MakePod(1000, 1, 400);
  const TypicalPods typical = OnlyShape(1, 600);
  EXPECT_EQ(Pick("bestfit", c, pod, typical).node, "empty");
  Picked packing = Pick("gpupacking", c, pod, typical);
  EXPECT_EQ(packing.node, "halves");
  EXPECT_EQ(packing.gpus, GpuSet{0b001});
  Picked fgd = Pick("fgd", c, pod, typical);
  EXPECT_EQ(fgd.node, "halves");
  EXPECT_EQ(fgd.gpus, GpuSet{0b001});
  std::unique_ptr<Policy> p = MakePolicy("fgd", typical);
  EXPECT_DOUBLE_EQ(p->Score(c.nodes[1], pod)->score, 400);  // 1000 -> 600
  EXPECT_DOUBLE_EQ(p->Score(c.nodes[0], pod)->score, 0);
}

// FGD picks the GPU inside a node: a 0.5-GPU pod on free [700, 1000] with 0.5-GPU typical pods.
// Best fit (every baseline) takes GPU 0 and leaves 0.2 there, a fragment; FGD takes GPU 1 and
// leaves [700, 500], both still usable.
TEST(Policies, FgdChoosesTheGpuThatKeepsSharesUsable) {
  Cluster c;
  c.nodes.push_back(MakeNode("n", 0, 32000, {700, 1000}));
  const Pod pod = MakePod(1000, 1, 500);
  const TypicalPods typical = OnlyShape(1, 500);
  EXPECT_EQ(Pick("fgd", c, pod, typical).gpus, GpuSet{0b10});
  for (const char* baseline : {"random", "bestfit", "gpupacking", "gpuclustering", "dotprod"})
    EXPECT_EQ(Pick(baseline, c, pod, typical).gpus, GpuSet{0b01}) << baseline;
}

// A 1-GPU, 1-CPU pod. "cpu-rich" has 128 CPUs and one GPU; "gpu-rich" 8 CPUs and 4 GPUs.
//  - bestfit: leftover 0.5*127/128 + 0 = 0.496 vs 0.5*7/128 + 0.5*3/8 = 0.215: gpu-rich.
//  - dotprod: product (128*1/128^2 + 1*1/8^2) = 0.023 vs (8/128^2 + 4/64) = 0.063: cpu-rich.
TEST(Policies, DotProdAndBestFitDisagreeOnWhichResourceMatters) {
  Cluster c;
  c.nodes.push_back(MakeNode("cpu-rich", 0, 128000, {1000}));
  c.nodes.push_back(MakeNode("gpu-rich", 0, 8000, {1000, 1000, 1000, 1000}));
  const Pod pod = MakePod(1000, 1, 1000);
  EXPECT_EQ(Pick("bestfit", c, pod).node, "gpu-rich");
  EXPECT_EQ(Pick("dotprod", c, pod).node, "cpu-rich");
}

// A 1-GPU pod. "ones" hosts only 1-GPU pods and has 6 GPUs free; "shares" hosts sharing pods and
// is fuller; "empty" hosts nothing.
//  - gpuclustering: the node whose pods are all of the pod's class: ones.
//  - bestfit: the fuller used node: shares.
TEST(Policies, GpuClusteringGroupsPodsOfTheSameClass) {
  Cluster c;
  c.nodes.push_back(MakeNode("ones", 0, 32000, {0, 0, 1000, 1000, 1000, 1000, 1000, 1000}));
  c.nodes[0].pods_by_class[1] = 2;
  c.nodes.push_back(MakeNode("shares", 0, 32000, {100, 1000}));
  c.nodes[1].pods_by_class[0] = 3;
  c.nodes.push_back(MakeNode("empty", 0, 32000, {1000, 1000}));
  const Pod pod = MakePod(1000, 1, 1000);
  EXPECT_EQ(Pick("gpuclustering", c, pod).node, "ones");
  EXPECT_EQ(Pick("bestfit", c, pod).node, "shares");
  // Bands: only-this-class 75 + fill, mixed 50 + fill, empty 25 + fill, other classes 0 + fill.
  std::unique_ptr<Policy> p = MakePolicy("gpuclustering", {});
  EXPECT_DOUBLE_EQ(p->Score(c.nodes[0], pod)->score, 75 + 25 * 2000 / 8000);
  EXPECT_DOUBLE_EQ(p->Score(c.nodes[1], pod)->score, 0 + 25 * (8000 - 1100) / 8000);
  EXPECT_DOUBLE_EQ(p->Score(c.nodes[2], pod)->score, 25 + 25 * 6000 / 8000);
}

TEST(Policies, GpuPackingScoresByBand) {
  std::unique_ptr<Policy> p = MakePolicy("gpupacking", {});
  const Pod share = MakePod(1000, 1, 300);
  // Shared GPU with 0.6 free: 100 - 60/10.
  EXPECT_DOUBLE_EQ(p->Score(MakeNode("a", 0, 8000, {600, 1000}), share)->score, 94);
  // Used node, a free GPU needed: 50 - 1.
  EXPECT_DOUBLE_EQ(p->Score(MakeNode("b", 0, 8000, {200, 1000}), share)->score, 49);
  // Empty 2-GPU node: 33 - 2; empty 8-GPU node: 33 - 8.
  EXPECT_DOUBLE_EQ(p->Score(MakeNode("c", 0, 8000, {1000, 1000}), share)->score, 31);
  EXPECT_DOUBLE_EQ(
      p->Score(MakeNode("d", 0, 8000, {1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}), share)
          ->score,
      25);
}

TEST(Policies, RandomSpreadsOverTheNodesThatFit) {
  Cluster c;
  c.nodes.push_back(MakeNode("a", 0, 8000, {1000}));
  c.nodes.push_back(MakeNode("full", 0, 8000, {0}));
  c.nodes.push_back(MakeNode("b", 0, 8000, {1000, 1000, 1000, 1000}));
  c.nodes.push_back(MakeNode("c", 0, 8000, {500}));
  std::unique_ptr<Policy> p = MakePolicy("random", {});
  Rng rng(7);
  std::map<std::string, int> seen;
  for (int i = 0; i < 300; ++i)
    ++seen[c.nodes[Choose(c, MakePod(1000, 1, 500), *p, rng)->node].name];
  EXPECT_EQ(seen.count("full"), 0U);
  EXPECT_GT(seen["a"], 50);
  EXPECT_GT(seen["b"], 50);
  EXPECT_GT(seen["c"], 50);
}

TEST(Choose, BreaksExactTiesAtRandomAndIsDeterministicPerSeed) {
  Cluster c;
  for (const char* name : {"a", "b", "c"}) c.nodes.push_back(MakeNode(name, 0, 8000, {1000}));
  std::unique_ptr<Policy> p = MakePolicy("bestfit", {});
  auto sequence = [&](uint64_t seed) {
    Rng rng(seed);
    std::string s;
    for (int i = 0; i < 30; ++i)
      s += c.nodes[Choose(c, MakePod(1000, 1, 1000), *p, rng)->node].name;
    return s;
  };
  const std::string first = sequence(3);
  EXPECT_EQ(first, sequence(3));
  EXPECT_NE(first.find('a'), std::string::npos);
  EXPECT_NE(first.find('b'), std::string::npos);
  EXPECT_NE(first.find('c'), std::string::npos);
}

// Own policy: where FGD sees no difference (a whole-GPU pod on two empty 2-GPU nodes, one with
// CPUs to spare), it best-fits instead of drawing at random.
TEST(Policies, FgdBestFitPacksWhereFragmentationDoesNotDecide) {
  Cluster c;
  c.nodes.push_back(MakeNode("roomy", 0, 64000, {1000, 1000}));
  c.nodes.push_back(MakeNode("tight", 0, 8000, {1000, 1000}));
  const TypicalPods typical = OnlyShape(1, 1000);
  std::unique_ptr<Policy> fgd = MakePolicy("fgd", typical);
  const Pod pod = MakePod(1000, 1, 1000);
  EXPECT_DOUBLE_EQ(fgd->Score(c.nodes[0], pod)->score, fgd->Score(c.nodes[1], pod)->score);
  EXPECT_EQ(Pick("fgd-bestfit", c, pod, typical).node, "tight");
}

}  // namespace
}  // namespace gpulet::placement
