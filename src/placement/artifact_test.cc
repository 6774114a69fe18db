// The FGD artifact's protocol (artifact.h): each scoring rule against scores worked out by hand on
// small nodes, the tie-break, GPU selection, typical pods, arrivals and the measurement; then a
// handful of pods through the replay, and (where this workspace has the trace and the artifact's
// published means) the default trace with two fixed seeds.
#include "placement/artifact.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "placement/test_clusters.h"
#include "placement/trace.h"
#include "support/require.h"

namespace gpulet::placement {
namespace {

using testing::MakeNode;
using testing::MakePod;

double ScoreOf(std::string_view policy, const Node& node, const Pod& pod,
               const TypicalPods& typical = {}) {
  return MakeArtifactPolicy(policy, typical)->Score(node, pod);
}

TEST(ArtifactScore, DotProdIsOneMinusHalfTheNormalisedDotProductTruncated) {
  const Pod pod = MakePod(16000, 1, 1000);
  // (64/128 * 16/128 + 2/8 * 1/8) / 2 = 0.046875 -> 95.3 -> 95.
  EXPECT_EQ(ScoreOf("dotprod", MakeNode("a", 0, 64000, {1000, 1000}), pod), 95);
  // (96/128 * 16/128 + 8/8 * 1/8) / 2 = 0.109375 -> 89.06 -> 89.
  EXPECT_EQ(ScoreOf("dotprod",
                    MakeNode("b", 0, 96000, {1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}), pod),
            89);
}

TEST(ArtifactScore, GpuClusteringBandsPlusIntegerFill) {
  Node shared = MakeNode("s", 0, 96000, {500, 1000, 1000, 1000, 1000, 1000, 1000, 1000});
  shared.pods_by_class[0] = 1;  // one sharing pod
  const Pod share = MakePod(1000, 1, 300), whole = MakePod(1000, 1, 1000),
            cpu = MakePod(1000, 0, 0);
  // Only its own class: 75 + 25 * (8000 - 7500) / 8000 = 75 + 1.
  EXPECT_EQ(ScoreOf("gpuclustering", shared, share), 76);
  // Another class only: 0 + 1.
  EXPECT_EQ(ScoreOf("gpuclustering", shared, whole), 1);
  Node mixed = shared;
  mixed.pods_by_class[1] = 1;
  EXPECT_EQ(ScoreOf("gpuclustering", mixed, share), 51);  // its class among others: 50 + 1
  const Node empty = MakeNode("e", 0, 64000, {1000, 1000});
  EXPECT_EQ(ScoreOf("gpuclustering", empty, whole), 25 + 18);  // 25 * 6000 / 8000 = 18
  EXPECT_EQ(ScoreOf("gpuclustering", shared, cpu), 0);
}

TEST(ArtifactScore, GpuPackingCases) {
  const Pod share300 = MakePod(1000, 1, 300), share600 = MakePod(1000, 1, 600);
  const Pod one = MakePod(1000, 1, 1000), two = MakePod(1000, 2, 1000);
  const Node used = MakeNode("u", 0, 64000, {500, 1000, 1000, 1000});
  EXPECT_EQ(ScoreOf("gpupacking", used, share300), 95);  // shared GPU: 100 - (50 / 10)
  EXPECT_EQ(ScoreOf("gpupacking", used, share600), 49);  // needs a free GPU: 50 - 1
  EXPECT_EQ(ScoreOf("gpupacking", used, one), 49);
  EXPECT_EQ(ScoreOf("gpupacking", used, two), 48);
  // Empty nodes: max(33 - GPUs, GPUs).
  EXPECT_EQ(ScoreOf("gpupacking", MakeNode("e2", 0, 64000, {1000, 1000}), one), 31);
  EXPECT_EQ(
      ScoreOf("gpupacking",
              MakeNode("e8", 0, 96000, {1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}), one),
      25);
  EXPECT_EQ(ScoreOf("gpupacking", used, MakePod(1000, 0, 0)), 0);
}

TEST(ArtifactScore, BestFitRawThenMinMaxNormalisedInIntegers) {
  const Pod pod = MakePod(16000, 1, 1000);
  // 1 - (48/128 * 0.5 + 1/8 * 0.5) = 0.75 -> 75.
  EXPECT_EQ(ScoreOf("bestfit", MakeNode("a", 0, 64000, {1000, 1000}), pod), 75);
  // 1 - (80/128 * 0.5 + 7/8 * 0.5) = 0.25 -> 25.
  EXPECT_EQ(ScoreOf("bestfit",
                    MakeNode("b", 0, 96000, {1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}), pod),
            25);
  EXPECT_TRUE(MakeArtifactPolicy("bestfit", {})->Normalized());
  EXPECT_EQ(NormalizeScore(75, 25, 75), 100);
  EXPECT_EQ(NormalizeScore(60, 25, 75), 70);
  EXPECT_EQ(NormalizeScore(30, 25, 92), 7);  // 500 / 67, truncated
  EXPECT_EQ(NormalizeScore(40, 40, 40), 0);  // all equal
}

TEST(ArtifactScore, FgdSigmoidOfTheDecreaseInGpus) {
  EXPECT_EQ(FgdScore(0), 50);
  EXPECT_EQ(FgdScore(1000), 73);   // sigmoid(1) = 0.731
  EXPECT_EQ(FgdScore(-1000), 26);  // 0.269
  EXPECT_EQ(FgdScore(136), 53);    // 0.534
  EXPECT_EQ(FgdScore(-250), 43);   // 0.438
  EXPECT_EQ(FgdScore(250), 56);    // 0.562

  // Typical pods: half (4 CPUs, 0.5 GPU), half (8 CPUs, 1 GPU).
  const TypicalPods typical =
      TypicalPods::FromList({{4000, 1, 500, false, 0, 0.5}, {8000, 1, 1000, false, 0, 0.5}});
  std::unique_ptr<ArtifactPolicy> fgd = MakeArtifactPolicy("fgd", typical);
  Rng rng(1);
  const Pod share = MakePod(4000, 1, 500);
  // F = 0 before; either GPU leaves {500, 1000} with 12 CPUs: the 1-GPU pod fragments 500,
  // F = 250, decrease -250 -> 43, on the first GPU.
  const Node a = MakeNode("a", 0, 16000, {1000, 1000});
  EXPECT_EQ(fgd->Score(a, share), 43);
  EXPECT_EQ(fgd->Gpus(a, share, rng), GpuSet{1});
  // F = 250 before ({500, 1000}); GPU 0 -> {0, 1000}: F = 0, +250 -> 56; GPU 1 -> {500, 500}:
  // F = 500, -250 -> 43. GPU 0 wins.
  const Node b = MakeNode("b", 0, 16000, {500, 1000});
  EXPECT_EQ(fgd->Score(b, share), 56);
  EXPECT_EQ(fgd->Gpus(b, share, rng), GpuSet{1});
  // A whole GPU (the lowest-indexed free one): {0, 1000} with 8 CPUs still hosts both: 50.
  EXPECT_EQ(fgd->Score(a, MakePod(8000, 1, 1000)), 50);
  EXPECT_EQ(fgd->Gpus(a, MakePod(8000, 1, 1000), rng), GpuSet{1});
  // A CPU-only pod leaving 4 CPUs: the 1-GPU pod no longer fits, F = 0.5 * 2000: -1000 -> 26.
  EXPECT_EQ(fgd->Score(a, MakePod(12000, 0, 0)), 26);
}

TEST(ArtifactChoose, EqualScoresGoToTheSmallestNameNotADraw) {
  Cluster c;
  for (int i = 0; i < 4; ++i)
    c.nodes.push_back(MakeNode("n" + std::to_string(i), 0, 16000, {1000, 1000}));
  const Pod pod = MakePod(4000, 1, 1000);
  const std::vector<uint32_t> rank = {3, 1, 0, 2};
  for (const char* name : {"dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"}) {
    std::unique_ptr<ArtifactPolicy> p = MakeArtifactPolicy(name, {});
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      Rng rng(seed);
      std::optional<Decision> d = ArtifactChoose(c, pod, *p, rank, rng);
      ASSERT_TRUE(d) << name;
      EXPECT_EQ(d->node, 2U) << name;  // rank 0
    }
  }
  // Random draws among the feasible nodes.
  std::set<size_t> drawn;
  std::unique_ptr<ArtifactPolicy> random = MakeArtifactPolicy("random", {});
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rng rng(seed);
    drawn.insert(ArtifactChoose(c, pod, *random, rank, rng)->node);
  }
  EXPECT_EQ(drawn.size(), 4U);
  // A node that does not fit is never chosen; nothing fits: nullopt.
  c.nodes[2].cpu_free = 1000;
  Rng rng(1);
  EXPECT_EQ(ArtifactChoose(c, pod, *MakeArtifactPolicy("bestfit", {}), rank, rng)->node, 1U);
  EXPECT_FALSE(ArtifactChoose(c, MakePod(64000, 1, 1000), *random, rank, rng));
  // The ranks are a permutation, fixed per seed.
  std::vector<uint32_t> r = ArtifactNodeRanks(100, 42);
  EXPECT_EQ(r, ArtifactNodeRanks(100, 42));
  EXPECT_NE(r, ArtifactNodeRanks(100, 43));
  std::sort(r.begin(), r.end());
  for (uint32_t i = 0; i < 100; ++i) EXPECT_EQ(r[i], i);
}

TEST(ArtifactGpus, RandomDrawsAmongFittingGpusOthersBestFit) {
  const Node n = MakeNode("n", 0, 64000, {200, 600, 1000, 400});
  const Pod share = MakePod(1000, 1, 350);
  std::set<GpuSet> drawn;
  std::unique_ptr<ArtifactPolicy> random = MakeArtifactPolicy("random", {});
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Rng rng(seed);
    drawn.insert(random->Gpus(n, share, rng));
  }
  EXPECT_EQ(drawn, (std::set<GpuSet>{GpuSet{1} << 1, GpuSet{1} << 2, GpuSet{1} << 3}));
  Rng rng(1);
  for (const char* name : {"dotprod", "gpuclustering", "gpupacking", "bestfit"})
    EXPECT_EQ(MakeArtifactPolicy(name, {})->Gpus(n, share, rng), GpuSet{1} << 3) << name;
  // Whole GPUs: the lowest-indexed free ones, for every policy.
  const Node m = MakeNode("m", 0, 64000, {1000, 500, 1000, 1000});
  for (const char* name : {"random", "dotprod", "bestfit", "fgd"})
    EXPECT_EQ(MakeArtifactPolicy(name, {})->Gpus(m, MakePod(1000, 2, 1000), rng), GpuSet{0b101})
        << name;
}

TEST(ArtifactTypicalPods, MostFrequentFirstTiesByDescendingShape) {
  std::vector<Pod> pods;
  auto add = [&](int n, int64_t cpu, int32_t num, int32_t milli) {
    for (int i = 0; i < n; ++i) pods.push_back(MakePod(cpu, num, milli));
  };
  add(3, 1000, 1, 500);   // A
  add(2, 1000, 1, 1000);  // B
  add(2, 2000, 0, 0);     // C: as frequent as B, more CPU: before B
  add(1, 4000, 1, 1000);  // D
  // 60 % of 8 pods = 4.8: A (3), then C (5): covered.
  const TypicalPods t = ArtifactTypicalPods(pods, 0.6);
  ASSERT_EQ(t.pods().size(), 2U);
  EXPECT_EQ(t.pods()[0].cpu_milli, 1000);
  EXPECT_EQ(t.pods()[0].gpu_milli, 500);
  EXPECT_DOUBLE_EQ(t.pods()[0].probability, 0.6);
  EXPECT_EQ(t.pods()[1].cpu_milli, 2000);  // C, not B
  EXPECT_EQ(t.pods()[1].num_gpu, 0);
  EXPECT_DOUBLE_EQ(t.pods()[1].probability, 0.4);
  EXPECT_EQ(ArtifactTypicalPods(pods, 0.95).pods().size(), 4U);
}

TEST(ArtifactArrivals, ShuffledTraceThenDrawsUntilThePerGpuShareWouldPassTheTarget) {
  std::vector<Pod> trace = {MakePod(1000, 1, 1000), MakePod(1000, 4, 1000)};
  trace[0].name = "a";
  trace[1].name = "b";
  // 5 GPUs of request; target 1.6 x 4 GPUs = 6.4. One more pod is drawn: the 1-GPU one (6 GPUs)
  // or the 4-GPU one, admitted because the artifact compares one GPU's share (5 + 1 <= 6.4),
  // which takes the request to 9 GPUs. The next draw passes the target either way.
  std::set<int64_t> totals;
  std::set<std::string> orders;
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    const std::vector<Pod> a = ArtifactArrivals(trace, 4000, 1.6, seed);
    ASSERT_EQ(a.size(), 3U);
    EXPECT_NE(a[0].name, a[1].name);
    int64_t total = 0;
    for (const Pod& p : a) total += p.GpuMilliRequest();
    totals.insert(total);
    orders.insert(a[0].name + a[1].name);
  }
  EXPECT_EQ(totals, (std::set<int64_t>{6000, 9000}));
  EXPECT_EQ(orders.size(), 2U);
  // Above the target: random pods removed until within it.
  const std::vector<Pod> down = ArtifactArrivals(trace, 4000, 1.0, 7);
  int64_t total = 0;
  for (const Pod& p : down) total += p.GpuMilliRequest();
  EXPECT_LE(total, 4000);
}

TEST(ArtifactReplay, PointIsTheMeanOverPodsWhoseArrivedShareRoundsToIt) {
  Cluster c;
  c.nodes.push_back(MakeNode("n", 0, 3000, {1000}));  // 1 GPU: 5 milli-GPU is 0.5 %
  std::vector<Pod> arrivals;
  for (int64_t cpu : {1000, 1000, 1000, 1000, 0}) arrivals.push_back(MakePod(cpu, 1, 5));
  // Arrived 0.5, 1.0, 1.5, 2.0, 2.5 %; the 4th pod finds no CPU: allocated 0.5, 1.0, 1.5, 1.5,
  // 2.0 %. Half to even: 0.5 -> 0, 1.0 -> 1, 1.5, 2.0, 2.5 -> 2.
  std::unique_ptr<ArtifactPolicy> p = MakeArtifactPolicy("bestfit", {});
  const std::vector<double> points = {0.01, 0.02, 0.03, 0.05};
  const ReplayResult r = ArtifactReplay(c, arrivals, *p, {}, points, 1);
  EXPECT_EQ(r.pods_failed, 1);
  ASSERT_EQ(r.points.size(), 3U);  // 5 % has nothing within 4..6 %
  EXPECT_DOUBLE_EQ(r.points[0].arrived, 0.01);
  EXPECT_NEAR(r.points[0].allocated, 0.010, 1e-12);
  EXPECT_NEAR(r.points[1].allocated, (1.5 + 1.5 + 2.0) / 3 / 100, 1e-12);
  // 3 %: nothing rounds to it; the pods within 2..4 % (those of 2 %) stand in.
  EXPECT_NEAR(r.points[2].allocated, r.points[1].allocated, 1e-12);
  EXPECT_NEAR(r.final.allocated, 0.02, 1e-12);
}

// A handful of pods through the whole protocol, every placement worked out by hand.
// n0: 16 CPUs, 2 GPUs; n1: 64 CPUs, 4 GPUs. Pods: a 1-GPU pod with 12 CPUs, then a 4-GPU pod.
// For the first pod every policy but Random prefers n0 (hand scores below), which leaves n1 for
// the 4-GPU pod: 5 of 6 GPUs allocated. Random puts the first pod on n1 half of the time, and then
// the 4-GPU pod fails: 1 of 6.
TEST(ArtifactReplay, HandfulOfPodsPerPolicy) {
  Cluster c;
  c.nodes.push_back(MakeNode("n0", 0, 16000, {1000, 1000}));
  c.nodes.push_back(MakeNode("n1", 0, 64000, {1000, 1000, 1000, 1000}));
  const Pod first = MakePod(12000, 1, 1000), second = MakePod(8000, 4, 1000);
  // The typical workload is the 4-GPU pod.
  const TypicalPods typical = TypicalPods::FromList({{8000, 4, 1000, false, 0, 1.0}});
  const std::map<std::string, std::pair<double, double>> hand = {
      {"dotprod", {97, 94}},        // 1 - 0.0215 / 1 - 0.0547
      {"gpuclustering", {43, 37}},  // 25 + 25 * 6000 / 8000; 25 + 25 * 4000 / 8000
      {"gpupacking", {31, 29}},     // 33 - 2; 33 - 4
      {"bestfit", {92, 60}},        // raw; normalised 100 and 0
      {"fgd", {73, 4}},             // n0: 2000 -> 1000 fragmented, +1000; n1: 0 -> 3000, -3000
  };
  const std::vector<double> points = {1.0};
  for (const auto& [name, scores] : hand) {
    std::unique_ptr<ArtifactPolicy> p = MakeArtifactPolicy(name, typical);
    EXPECT_EQ(p->Score(c.nodes[0], first), scores.first) << name;
    EXPECT_EQ(p->Score(c.nodes[1], first), scores.second) << name;
    const ReplayResult r =
        ArtifactReplay(c, std::vector<Pod>{first, second}, *p, typical, points, 3);
    EXPECT_EQ(r.pods_failed, 0) << name;
    EXPECT_NEAR(r.final.allocated, 5.0 / 6, 1e-12) << name;
  }
  std::set<int64_t> failed;
  std::unique_ptr<ArtifactPolicy> random = MakeArtifactPolicy("random", typical);
  for (uint64_t seed = 1; seed <= 30; ++seed)
    failed.insert(ArtifactReplay(c, std::vector<Pod>{first, second}, *random, typical, points, seed)
                      .pods_failed);
  EXPECT_EQ(failed, (std::set<int64_t>{0, 1}));
}

// The artifact's published seed means for the default trace (README in that directory).
std::map<std::pair<std::string, int>, double> ArtifactMeans(const std::string& path) {
  std::map<std::pair<std::string, int>, double> out;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    if (f.size() < 5) continue;
    std::string policy = f[1].substr(f[1].find('-') + 1);
    std::transform(policy.begin(), policy.end(), policy.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    out[{policy, std::stoi(f[3])}] = std::stod(f[4]);
  }
  return out;
}

// Two fixed seeds of the default trace against the artifact's ten-seed means: every policy within
// 1 point at every 5 % (the spread over seeds is up to 0.6 points; `make bench` runs all ten seeds
// and holds the reproduction to 0.5).
TEST(ArtifactReproduction, DefaultTraceTwoSeeds) {
  const char* env = std::getenv("GPULET_TRACE_DIR");
  const std::string shared = gpulet::testing::SharedDir();
  const std::string dir = env ? env : shared + "/traces/alibaba-openb";
  const std::string means_path = shared + "/upstream/fgd-artifact/default-alloc_ratio_summary.csv";
  GPULET_REQUIRE_SHARED(dir + "/openb_pod_list_default.csv");
  GPULET_REQUIRE_SHARED(means_path);
  const std::map<std::pair<std::string, int>, double> art = ArtifactMeans(means_path);
  Result<Cluster> cluster = LoadNodes(GpuNodeListPath(dir));
  ASSERT_TRUE(cluster.ok());
  Result<std::vector<Pod>> trace = LoadPods(TraceVariantPath(dir, "default"), *cluster);
  ASSERT_TRUE(trace.ok());
  const TypicalPods typical = ArtifactTypicalPods(*trace);
  EXPECT_EQ(typical.pods().size(), 35U);
  const std::vector<double> points = DefaultReportPoints(1.3);
  std::vector<std::vector<Pod>> arrivals;
  for (uint64_t seed : {42, 43})
    arrivals.push_back(ArtifactArrivals(*trace, cluster->GpuCapacityMilli(), 1.3, seed));
  for (const char* name : {"random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"}) {
    std::unique_ptr<ArtifactPolicy> p = MakeArtifactPolicy(name, typical);
    std::map<int, double> mean;
    for (size_t s = 0; s < arrivals.size(); ++s)
      for (const LoadPoint& lp :
           ArtifactReplay(*cluster, arrivals[s], *p, typical, points, 42 + s).points)
        mean[static_cast<int>(std::lround(lp.arrived * 100))] += lp.allocated * 100 / 2;
    ASSERT_EQ(mean.size(), points.size()) << name;
    for (const auto& [pct, value] : mean)
      EXPECT_NEAR(value, art.at({name, pct}), 1.0) << name << " at " << pct << " %";
  }
}

}  // namespace
}  // namespace gpulet::placement
