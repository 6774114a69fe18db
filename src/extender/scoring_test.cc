// The placement policies in the extender (scoring.h): the flag, the pick of a request's nodes,
// the GPU reserved at bind, and live path = replay on a reduced openb trace (equivalence.h).
#include "extender/scoring.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "extender/equivalence.h"
#include "extender/extender.h"
#include "extender/test_objects.h"
#include "extender/view.h"
#include "placement/trace.h"
#include "support/require.h"

namespace gpulet::extender {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace testobjects;

TEST(PolicyFlag, UnknownNamesAreRefusedWithTheChoices) {
  auto s = PolicyFromFlags("tetris", "");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kUsage);
  EXPECT_THAT(s.status().message(), HasSubstr("--policy"));
  EXPECT_THAT(s.status().message(), HasSubstr("gpuclustering"));
  EXPECT_THAT(s.status().message(), HasSubstr("fgd-bestfit"));
  EXPECT_THAT(s.status().message(), HasSubstr("\"tetris\""));
}

TEST(PolicyFlag, FgdNeedsAWorkload) {
  for (const char* name : {"fgd", "fgd-bestfit"}) {
    auto s = PolicyFromFlags(name, "");
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_THAT(s.status().message(), HasSubstr("needs --workload")) << name;
  }
}

TEST(PolicyFlag, EveryReplayNameIsAcceptedAndSpreadStaysTheExtendersOwn) {
  const std::string path = ::testing::TempDir() + "gpulet-workload.csv";
  {
    std::ofstream out(path);
    out << "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
           "p1,1000,1024,1,500,\n"
           "p2,1000,1024,1,500,T4|V100M16\n"
           "p3,2000,1024,2,1000,\n";
  }
  for (const std::string& name : placement::PolicyNames()) {
    auto s = PolicyFromFlags(name, path);
    ASSERT_TRUE(s.ok()) << name << ": " << s.status().message();
    ASSERT_NE(*s, nullptr);
    EXPECT_EQ((*s)->policy().Name(), name);
    EXPECT_THAT((*s)->models(), ElementsAre("T4", "V100M16"));
  }
  auto spread = PolicyFromFlags("spread", "");
  ASSERT_TRUE(spread.ok());
  EXPECT_EQ(*spread, nullptr);
  auto missing = PolicyFromFlags("fgd", path + ".absent");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("--workload"));
}

TEST(PolicyFlag, TheWorkloadIsProjectedOnTheGpu) {
  const std::string path = ::testing::TempDir() + "gpulet-workload2.csv";
  {
    std::ofstream out(path);
    // Two CPU sizes of the same GPU shape: one typical pod once CPU is dropped.
    out << "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
           "a,1000,1024,1,500\nb,8000,1024,1,500\n";
  }
  std::vector<std::string> models;
  auto t = LoadWorkload(path, models);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(t->pods().size(), 1u);
  EXPECT_EQ(t->pods()[0].cpu_milli, 0);
  EXPECT_EQ(t->pods()[0].gpu_milli, 500);
}

TEST(ShareOf, RoundsDownSoThatAFitInUnitsFitsInMilli) {
  EXPECT_EQ(ShareOf(500, 1000), 500);
  EXPECT_EQ(ShareOf(1, 3), 333);  // a third, rounded down like a third of free units
  EXPECT_EQ(ShareOf(3, 3), 1000);
  EXPECT_EQ(ShareOf(1, 81920), 1);  // never 0: a pod asking something asks a share
  EXPECT_EQ(ShareOf(40960, 81920), 500);
}

// The pick: the best node 10 (equal scores: the smallest name), the others 0..9 by score.
TEST(PickScores, TheBestNodeAloneGetsTheMaximum) {
  auto s = PlacementScorer::Make("gpupacking", {}, {});
  ASSERT_TRUE(s.ok());
  const std::vector<std::optional<double>> scores = {50, 75, std::nullopt, 75, 25};
  const std::vector<std::string_view> names = {"n0", "n3", "n1", "n2", "n4"};
  // n3 and n2 tie at 75: n2 is the smaller name. 50 is halfway from 25 to 75: 4 of 0..9.
  EXPECT_THAT(PickScores((*s)->policy(), scores, names), ElementsAre(4, 9, 0, 10, 0));
}

TEST(PickScores, BestFitIsNormalisedOverTheRequestsNodesAndRandomLeavesTheDrawToTheScheduler) {
  auto bestfit = PlacementScorer::Make("bestfit", {}, {});
  ASSERT_TRUE(bestfit.ok());
  // Normalised: (s - 90) * 100 / 3 → 0, 33, 100; then 0..9 of the range.
  const std::vector<std::optional<double>> scores = {90, 91, 93};
  const std::vector<std::string_view> names = {"a", "b", "c"};
  EXPECT_THAT(PickScores((*bestfit)->policy(), scores, names), ElementsAre(0, 2, 10));
  auto random = PlacementScorer::Make("random", {}, {});
  ASSERT_TRUE(random.ok());
  EXPECT_THAT(PickScores((*random)->policy(), {{1.0, std::nullopt, 0.0}}, names),
              ElementsAre(10, 0, 10));
}

// A hand-computed case through the verbs: 2 GPUs of 1000 units each. Node a is empty; node b has
// 600 free on GPU 0. BestFit (artifact): a: 1 - (2000 - 500) / 8000 / 2 → 90; b: 1 - 1100 / 8000
// / 2 → 93; normalised a 0, b 100: b is the pick, and its best-fitting GPU is GPU 0.
TEST(PlacementInTheView, BestFitPrioritizesAndReservesTheGpuThePolicyChooses) {
  FakeClock clock;
  auto scorer = PlacementScorer::Make("bestfit", {}, {});
  ASSERT_TRUE(scorer.ok());
  ViewOptions o;
  o.placement = *scorer;
  ClusterView view(clock, o);
  view.UpsertObject(MemoryConfigMap("a", MemoryJson("a", {{1000, 1000}, {1000, 1000}}).dump()));
  view.UpsertObject(MemoryConfigMap("b", MemoryJson("b", {{1000, 600}, {1000, 1000}}).dump()));
  auto pod = ParsePodRequest(MemoryPod("p", {500}));
  ASSERT_TRUE(pod.ok()) << pod.status().message();
  EXPECT_EQ(view.Evaluate(*pod, "a").policy_score, 90);
  EXPECT_EQ(view.Evaluate(*pod, "b").policy_score, 93);
  EXPECT_THAT(view.Scores(*pod, std::vector<std::string>{"a", "b"}), ElementsAre(0, 10));
  auto held = view.Reserve(*pod, "b");
  ASSERT_TRUE(held.ok()) << held.status().message();
  ASSERT_EQ(held->size(), 1u);
  EXPECT_EQ((*held)[0].gpu, GpuUuid("b", 0));
  // The next pod of 500 sees b with 100 free on GPU 0 (the reservation): b scores
  // 1 - (1100 - 500) / 8000 / 2 → 96, and GPU 0 is no longer enough.
  auto next = ParsePodRequest(MemoryPod("q", {500}));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(view.Evaluate(*next, "b").policy_score, 96);
  auto held2 = view.Reserve(*next, "b");
  ASSERT_TRUE(held2.ok());
  EXPECT_EQ((*held2)[0].gpu, GpuUuid("b", 1));  // GPU 0 has 100 left: not enough
}

// GpuClustering reads the node's pods by class: the pods its object lists and the reservations.
TEST(PlacementInTheView, GpuClusteringCountsListedAndReservedPods) {
  FakeClock clock;
  auto scorer = PlacementScorer::Make("gpuclustering", {}, {});
  ASSERT_TRUE(scorer.ok());
  ViewOptions o;
  o.placement = *scorer;
  ClusterView view(clock, o);
  const nlohmann::json listed = nlohmann::json::array(
      {{{"namespace", "default"}, {"name", "whole"}, {"container", "c0"},
        {"gpu", GpuUuid("w", 0)}, {"units", 1000}}});
  view.UpsertObject(
      MemoryConfigMap("w", MemoryJson("w", {{1000, 0}, {1000, 1000}}, 1, listed).dump()));
  view.UpsertObject(MemoryConfigMap("e", MemoryJson("e", {{1000, 1000}, {1000, 1000}}).dump()));
  view.UpsertObject(MemoryConfigMap("s", MemoryJson("s", {{1000, 1000}, {1000, 1000}}).dump()));
  auto sharing = ParsePodRequest(MemoryPod("p", {300}));
  ASSERT_TRUE(sharing.ok());
  ASSERT_TRUE(view.Reserve(*sharing, "s").ok());  // s now hosts a sharing pod
  auto pod = ParsePodRequest(MemoryPod("q", {300}));
  ASSERT_TRUE(pod.ok());
  // Band + 25 · (8000 − free milli) / 8000 in integers: s hosts only sharing pods: 75 + 19
  // (1700 free); e is empty: 25 + 18 (2000 free); w hosts only whole-GPU pods: 0 + 21 (1000).
  EXPECT_EQ(view.Evaluate(*pod, "s").policy_score, 94);
  EXPECT_EQ(view.Evaluate(*pod, "e").policy_score, 43);
  EXPECT_EQ(view.Evaluate(*pod, "w").policy_score, 21);
}

// Pods with several containers keep the extender's own per-container placement.
TEST(PlacementInTheView, SeveralContainersKeepTheExtendersOwnScore) {
  FakeClock clock;
  auto scorer = PlacementScorer::Make("bestfit", {}, {});
  ASSERT_TRUE(scorer.ok());
  ViewOptions o;
  o.placement = *scorer;
  ClusterView view(clock, o);
  view.UpsertObject(MemoryConfigMap("a", MemoryJson("a", {{80, 80}, {80, 80}}).dump()));
  auto pod = ParsePodRequest(MemoryPod("p", {30, 30}));
  ASSERT_TRUE(pod.ok());
  const NodeVerdict v = view.Evaluate(*pod, "a");
  EXPECT_TRUE(v.fits);
  EXPECT_FALSE(v.policy_score.has_value());
  ClusterView legacy(clock, {});
  legacy.UpsertObject(MemoryConfigMap("a", MemoryJson("a", {{80, 80}, {80, 80}}).dump()));
  EXPECT_EQ(view.Scores(*pod, std::vector<std::string>{"a"}),
            legacy.Scores(*pod, std::vector<std::string>{"a"}));
}

// Live path = replay on a reduced openb trace: the first 40 GPU nodes (174 GPUs), the first 300
// one-GPU arrivals of seed 42 at 260 % (about 240 GPUs asked: some pods find no room), every
// deterministic policy, through the Extender's verbs in
// process (tests/extender/extender_policy_replay_test.cc: through HTTP).
// The openb default trace, read once for the tests below (skipped without ../shared).
class LiveEqualsReplay : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(GPULET_SOURCE_DIR) + "/../shared/traces/alibaba-openb";
    GPULET_REQUIRE_SHARED(placement::GpuNodeListPath(dir));
    auto cluster = placement::LoadNodes(placement::GpuNodeListPath(dir));
    ASSERT_TRUE(cluster.ok()) << cluster.status().message();
    auto pods = placement::LoadPods(placement::TraceVariantPath(dir, "default"), *cluster);
    ASSERT_TRUE(pods.ok()) << pods.status().message();
    cluster_ = std::move(cluster).value();
    pods_ = std::move(pods).value();
  }
  // The first 40 GPU nodes and 300 one-GPU arrivals of seed 42 at 260 %, so that some pods find
  // no room.
  Result<EquivalenceSetup> Reduced(const EquivalenceOptions& options) {
    EquivalenceOptions o = options;
    o.max_nodes = 40;
    o.max_pods = 300;
    o.load = 2.6;
    return PrepareEquivalence(cluster_, pods_, o);
  }
  placement::Cluster cluster_;
  std::vector<placement::Pod> pods_;
};

TEST_F(LiveEqualsReplay, ReducedOpenbTraceEveryDeterministicPolicy) {
  for (const char* policy :
       {"fgd", "fgd-bestfit", "bestfit", "dotprod", "gpupacking", "gpuclustering"}) {
    EquivalenceOptions o;
    o.policy = policy;
    auto setup = Reduced(o);
    ASSERT_TRUE(setup.ok()) << setup.status().message();
    ASSERT_EQ(setup->arrivals.size(), 300u);
    auto r = RunEquivalenceInProcess(*setup, o);
    ASSERT_TRUE(r.ok()) << policy << ": " << r.status().message();
    EXPECT_EQ(r->pods, 300);
    EXPECT_EQ(r->identical, r->pods) << policy << ": " << ::testing::PrintToString(r->differences);
    EXPECT_GT(r->placed, 0) << policy;
    EXPECT_GT(r->failed, 0) << policy << ": the reduced cluster is to be overloaded";
    for (size_t i = 0; i < r->live.size(); ++i) {
      ASSERT_EQ(r->live[i], r->replay[i]) << policy << " " << setup->arrivals[i].name;
      if (!r->live[i].node.empty()) {
        ASSERT_GE(r->live[i].gpu, 0);
      }
    }
  }
}

// The comparison has teeth: another policy on the live side is found out.
TEST_F(LiveEqualsReplay, AnotherPolicyLiveIsFoundOut) {
  EquivalenceOptions o;
  o.policy = "fgd";
  auto setup = Reduced(o);
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  auto r = RunEquivalenceInProcess(*setup, o, "bestfit");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_LT(r->identical, r->pods);
  EXPECT_FALSE(r->differences.empty());
}

// The export a live side outside the process replays (bench/fleet, the real kube-scheduler): the
// nodes and arrivals of the setup, and the replay's placements and allocation over them.
TEST_F(LiveEqualsReplay, ExportCarriesTheSetupAndTheReplaysPlacements) {
  EquivalenceOptions o;
  auto setup = Reduced(o);
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  auto r = RunEquivalenceInProcess(*setup, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const nlohmann::json e = EquivalenceExport(*setup, *r);
  EXPECT_EQ(e["resource"], kEquivalenceResource);
  ASSERT_EQ(e["nodes"].size(), 40u);
  ASSERT_EQ(e["objects"].size(), 40u);
  int64_t capacity = 0;
  for (size_t i = 0; i < 40; ++i) {
    EXPECT_EQ(e["nodes"][i]["name"], setup->cluster.nodes[i].name);
    EXPECT_EQ(e["nodes"][i]["gpus"], setup->cluster.nodes[i].GpuCount());
    capacity += setup->cluster.nodes[i].GpuCount() * 1000;
  }
  ASSERT_EQ(e["arrivals"].size(), 300u);
  int64_t placed = 0, units = 0;
  for (size_t i = 0; i < 300; ++i) {
    const nlohmann::json& a = e["arrivals"][i];
    EXPECT_EQ(a["units"], setup->arrivals[i].gpu_milli);
    EXPECT_EQ(a["replay"]["node"], r->replay[i].node);
    EXPECT_EQ(a["replay"]["gpu"], r->replay[i].gpu);
    EXPECT_EQ(a["models"].empty(), !setup->arrivals[i].model_constrained);
    if (!r->replay[i].node.empty()) {
      ++placed;
      units += setup->arrivals[i].gpu_milli;
    }
  }
  EXPECT_GT(placed, 0);
  EXPECT_LT(placed, 300) << "the reduced cluster is to be overloaded";
  EXPECT_EQ(e["replay"]["placed"], placed);
  EXPECT_EQ(e["replay"]["failed"], 300 - placed);
  EXPECT_EQ(e["replay"]["placedUnits"], units);
  EXPECT_EQ(e["replay"]["capacityUnits"], capacity);
}

TEST(LiveEqualsReplayRandom, IsRefused) {
  EquivalenceSetup setup;
  EquivalenceOptions o;
  o.policy = "random";
  auto r = RunEquivalence(setup, o, {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("random"));
}

}  // namespace
}  // namespace gpulet::extender
