#include "placement/replay.h"

#include <gtest/gtest.h>

#include <set>

#include "placement/test_clusters.h"

namespace gpulet::placement {
namespace {

using testing::MakeNode;
using testing::MakePod;

std::vector<Pod> SmallTrace() {
  std::vector<Pod> pods;
  for (int i = 0; i < 4; ++i) pods.push_back(MakePod(1000, 1, 500));
  pods.push_back(MakePod(1000, 2, 1000));
  pods.push_back(MakePod(1000, 0, 0));
  for (size_t i = 0; i < pods.size(); ++i) pods[i].name = "p" + std::to_string(i);
  return pods;
}

TEST(ArrivalSequence, ShufflesThenResamplesUntilTheLoadIsReached) {
  const std::vector<Pod> trace = SmallTrace();                       // 4 GPUs of request in all
  const std::vector<Pod> a = ArrivalSequence(trace, 2000, 1.3, 42);  // 2.6 GPUs
  int64_t total = 0;
  for (const Pod& p : a) total += p.GpuMilliRequest();
  EXPECT_GE(total, 2600);
  EXPECT_LT(total - a.back().GpuMilliRequest(), 2600);  // stops at the first pod past the target
  const std::vector<Pod> b = ArrivalSequence(trace, 4000, 2.0, 42);  // 8 GPUs: resampled
  int64_t total_b = 0;
  for (const Pod& p : b) total_b += p.GpuMilliRequest();
  EXPECT_GE(total_b, 8000);
  EXPECT_GT(b.size(), trace.size());
  // Every trace pod arrives once before any is drawn again.
  std::set<std::string> first(  // NOLINT
      [&] {
        std::set<std::string> s;
        for (size_t i = 0; i < trace.size(); ++i) s.insert(b[i].name);
        return s;
      }());
  EXPECT_EQ(first.size(), trace.size());
  // Deterministic per seed, different across seeds.
  auto names = [](const std::vector<Pod>& pods) {
    std::string s;
    for (const Pod& p : pods) s += p.name + ",";
    return s;
  };
  EXPECT_EQ(names(ArrivalSequence(trace, 4000, 2.0, 42)), names(b));
  std::set<std::string> orders;
  for (uint64_t seed = 1; seed <= 8; ++seed)
    orders.insert(names(ArrivalSequence(trace, 4000, 2.0, seed)));
  EXPECT_GT(orders.size(), 1U);
}

TEST(Replay, RecordsAllocationAtLoadPointsAndFailures) {
  Cluster c;
  c.nodes.push_back(MakeNode("a", 0, 64000, {1000, 1000}));
  c.nodes.push_back(MakeNode("b", 0, 64000, {1000, 1000}));
  // 4 GPUs of capacity; arrivals: 2-GPU, 2-GPU, 2-GPU (fails), 0.5-GPU (fails), CPU-only.
  std::vector<Pod> arrivals = {MakePod(1000, 2, 1000), MakePod(1000, 2, 1000),
                               MakePod(1000, 2, 1000), MakePod(1000, 1, 500), MakePod(1000, 0, 0)};
  std::unique_ptr<Policy> p = MakePolicy("bestfit", {});
  const std::vector<double> points = {0.5, 1.0, 1.5, 1.625, 2.0};
  ReplayResult r = Replay(c, arrivals, *p, TypicalPods{}, points, 1);
  EXPECT_EQ(r.policy, "bestfit");
  EXPECT_EQ(r.capacity_milli, 4000);
  EXPECT_EQ(r.pods_arrived, 5);
  EXPECT_EQ(r.pods_failed, 2);
  EXPECT_EQ(r.failed["2-gpu"].pods, 1);
  EXPECT_EQ(r.failed["2-gpu"].gpu_milli, 2000);
  EXPECT_EQ(r.failed["share"].pods, 1);
  ASSERT_EQ(r.points.size(), 4U);  // 2.0 is never reached (6.5 of 4 GPUs = 1.625)
  EXPECT_DOUBLE_EQ(r.points[0].arrived, 0.5);
  EXPECT_DOUBLE_EQ(r.points[0].allocated, 0.5);
  EXPECT_DOUBLE_EQ(r.points[1].allocated, 1.0);
  EXPECT_DOUBLE_EQ(r.points[2].allocated, 1.0);
  EXPECT_DOUBLE_EQ(r.points[3].arrived, 1.625);
  EXPECT_DOUBLE_EQ(r.final.allocated, 1.0);
  EXPECT_DOUBLE_EQ(r.final.arrived, 1.625);
  // The input cluster is not changed.
  EXPECT_EQ(c.GpuAllocatedMilli(), 0);
}

TEST(Replay, TracksClusterFragmentation) {
  Cluster c;
  c.nodes.push_back(MakeNode("a", 0, 64000, {1000}));
  TypicalPod whole;
  whole.cpu_milli = 1000;
  whole.num_gpu = 1;
  whole.gpu_milli = 1000;
  whole.probability = 1;
  std::unique_ptr<Policy> p = MakePolicy("bestfit", {});
  const std::vector<double> points = {0.3};
  ReplayResult r = Replay(c, std::vector<Pod>{MakePod(1000, 1, 300)}, *p,
                          TypicalPods::FromList({whole}), points, 1);
  // 0.7 GPU left that no whole-GPU pod can use: all of the idle share is fragmented.
  ASSERT_EQ(r.points.size(), 1U);
  EXPECT_DOUBLE_EQ(r.points[0].fragmented_gpus, 0.7);
  EXPECT_DOUBLE_EQ(r.points[0].fragmented_of_idle, 1.0);
}

TEST(Summarize, MeanSpreadAndFailuresPerPolicy) {
  ReplayResult a{"fgd", 1, 1000, 10, 2, {{1.0, 0.9, 0, 0}}, {{"share", {2, 800}}}, {}};
  ReplayResult b{"fgd", 2, 1000, 10, 4, {{1.0, 0.8, 0, 0}}, {{"share", {4, 1600}}}, {}};
  ReplayResult c{"random", 1, 1000, 10, 0, {{1.0, 0.7, 0, 0}}, {}, {}};
  std::vector<ReplayResult> runs = {a, b, c};
  std::vector<PolicySummary> s = Summarize(runs);
  ASSERT_EQ(s.size(), 2U);
  EXPECT_EQ(s[0].policy, "fgd");
  EXPECT_EQ(s[0].seeds, (std::vector<uint64_t>{1, 2}));
  ASSERT_EQ(s[0].points.size(), 1U);
  EXPECT_NEAR(s[0].points[0].mean, 0.85, 1e-12);
  EXPECT_NEAR(s[0].points[0].stddev, 0.0707107, 1e-6);
  EXPECT_DOUBLE_EQ(s[0].points[0].min, 0.8);
  EXPECT_DOUBLE_EQ(s[0].points[0].max, 0.9);
  EXPECT_DOUBLE_EQ(s[0].failed_pods_mean["share"], 3);
  EXPECT_DOUBLE_EQ(s[0].failed_pods_total_mean, 3);
  EXPECT_EQ(s[1].policy, "random");
  EXPECT_DOUBLE_EQ(s[1].points[0].stddev, 0);
}

TEST(DefaultReportPoints, EveryFivePercentFromHalfToTheLoad) {
  std::vector<double> p = DefaultReportPoints(1.3);
  ASSERT_EQ(p.size(), 17U);
  EXPECT_DOUBLE_EQ(p.front(), 0.5);
  EXPECT_DOUBLE_EQ(p.back(), 1.3);
  EXPECT_EQ(DefaultReportPoints(1.0).size(), 11U);
}

}  // namespace
}  // namespace gpulet::placement
