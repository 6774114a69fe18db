#include "slurm/pod.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "slurm/fake_runner.h"

namespace gpulet::slurm {
namespace {

using testing::FakeRunner;
using ::testing::HasSubstr;

// What NVML shows in a container: `whole` GPUs, then one GPU in MIG mode with `migs` devices.
gpu::Inventory Container(std::vector<std::string> whole, std::vector<std::string> migs = {}) {
  gpu::Inventory inv;
  unsigned i = 0;
  for (const std::string& u : whole) {
    gpu::Gpu g;
    g.index = i++;
    g.uuid = u;
    g.name = "NVIDIA H100 80GB HBM3";
    inv.gpus.push_back(g);
  }
  if (!migs.empty()) {
    gpu::Gpu g;
    g.index = i++;
    g.uuid = "GPU-migparent";
    g.name = "NVIDIA A100-SXM4-40GB";
    g.mig_capable = g.mig_enabled = true;
    for (const std::string& u : migs) {
      gpu::MigDevice m;
      m.uuid = u;
      m.profile = "1g.5gb";
      m.mig_index = static_cast<unsigned>(g.mig_devices.size());
      g.mig_devices.push_back(m);
    }
    inv.gpus.push_back(g);
  }
  inv.links.assign(inv.gpus.size(), std::vector<gpu::Link>(inv.gpus.size()));
  return inv;
}

TEST(PodAllocation, ParsesTheEnvironmentAndRefusesNoAllocation) {
  Result<std::vector<std::string>> ids = ParseAllocatedDevices("GPU-a, GPU-b,GPU-a");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<std::string>{"GPU-a", "GPU-b"}));
  for (const char* bad : {"", "all", "none", "void", " , "}) {
    Result<std::vector<std::string>> r = ParseAllocatedDevices(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("NVIDIA_VISIBLE_DEVICES")) << bad;
  }
}

TEST(PodAllocation, UuidsThatAgreeGiveTheDevices) {
  Result<PodDevices> d = MatchAllocation(Container({"GPU-a", "GPU-b"}, {"MIG-x", "MIG-y"}),
                                         {"MIG-y", "GPU-b", "GPU-a", "MIG-x"});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->gpus, (std::vector<std::string>{"GPU-a", "GPU-b"}));
  EXPECT_EQ(d->migs, (std::vector<std::string>{"MIG-x", "MIG-y"}));
}

TEST(PodAllocation, ParentUuidCoversItsMigDevices) {
  Result<PodDevices> d = MatchAllocation(Container({}, {"MIG-x", "MIG-y"}), {"GPU-migparent"});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->migs.size(), 2u);
}

TEST(PodAllocation, DisagreementNamesBothSides) {
  Result<PodDevices> d = MatchAllocation(Container({"GPU-a", "GPU-c"}), {"GPU-a", "GPU-b"});
  ASSERT_FALSE(d.ok());
  const std::string& m = d.status().message();
  EXPECT_THAT(m, HasSubstr("NVIDIA_VISIBLE_DEVICES names GPU-a,GPU-b"));
  EXPECT_THAT(m, HasSubstr("NVML in this container sees GPU-a,GPU-c"));
  EXPECT_THAT(m, HasSubstr("allocated, not seen: GPU-b"));
  EXPECT_THAT(m, HasSubstr("seen, not allocated: GPU-c"));
}

TEST(PodAllocation, MoreSeenThanAllocatedIsRefused) {
  Result<PodDevices> d = MatchAllocation(Container({"GPU-a", "GPU-b"}), {"GPU-a"});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("seen, not allocated: GPU-b"));
  Result<PodDevices> none = MatchAllocation(Container({}), {"GPU-a"});
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("sees no GPU"));
}

TEST(PodAllocation, IndexEntriesAreCheckedByCount) {
  EXPECT_TRUE(MatchAllocation(Container({"GPU-a", "GPU-b"}), {"4", "5"}).ok());
  EXPECT_TRUE(MatchAllocation(Container({}, {"MIG-x"}), {"3:1"}).ok());
  Result<PodDevices> d = MatchAllocation(Container({"GPU-a", "GPU-b"}), {"4"});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("1 GPU(s) and 0 MIG device(s) for GPU-a,GPU-b"));
}

TEST(PodLabels, DownwardApiFileAndFeatures) {
  std::map<std::string, std::string> labels = ParsePodLabels(
      "app=\"slurmd\"\nslurm.gpulet.io/partition=\"h100\"\n"
      "slurm.gpulet.io/features=\"nvlink, ib,h100\"\nbroken line\n");
  EXPECT_EQ(labels.at("app"), "slurmd");
  Result<std::vector<std::string>> f = NodeFeatures(labels, "");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f, (std::vector<std::string>{"h100", "nvlink", "ib"}));
  Result<std::vector<std::string>> o = NodeFeatures(labels, "debug");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->front(), "debug");
  EXPECT_TRUE(NodeFeatures({}, "")->empty());
  Result<std::vector<std::string>> bad = NodeFeatures({{kPodFeaturesLabel, "a b"}}, "");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("\"a b\""));
}

TEST(PodCpus, CoresAreNumberedAmongTheContainersCores) {
  // Machine: CPUs 0-3 are cores 0-3, CPUs 4-7 their hyperthreads. Container: CPUs 2,3,6,7.
  std::map<unsigned, unsigned> topo;
  for (unsigned c = 0; c < 8; ++c) topo[c] = c % 4;
  std::map<unsigned, unsigned> idx = ContainerCoreIndex({2, 3, 6, 7}, topo);
  EXPECT_EQ(idx, (std::map<unsigned, unsigned>{{2, 0}, {3, 1}, {6, 0}, {7, 1}}));
  EXPECT_EQ(ContainerCoreIndex({5, 9}, {}), (std::map<unsigned, unsigned>{{5, 0}, {9, 1}}));
}

TEST(PodMemory, CgroupLimitCappedByMemTotal) {
  EXPECT_EQ(ContainerMemoryMib("2147483648\n", 64u << 20), 2048u);
  EXPECT_EQ(ContainerMemoryMib("max\n", 8u << 20), 8192u);
  EXPECT_EQ(ContainerMemoryMib("1099511627776", 8u << 20), 8192u);
}

TEST(PodConf, DynamicNodeLine) {
  NodeGres g;
  GresRecord r;
  r.name = "gpu";
  r.type = "h100";
  r.files = {"/dev/nvidia4"};
  g.records = {r, r};
  EXPECT_EQ(DynamicNodeConf(g, 8, 4096, {"h100", "ib"}),
            "CPUs=8 RealMemory=4096 Gres=gpu:h100:2 Feature=h100,ib");
  EXPECT_EQ(DynamicNodeConf(g, 0, 0, {}), "Gres=gpu:h100:2");
}

TEST(PodState, BusyFromNodeState) {
  auto busy = [](const std::string& state) { return NodeBusy(NodeStatus{"n", state, ""}); };
  EXPECT_TRUE(busy("ALLOCATED"));
  EXPECT_TRUE(busy("MIXED+DRAIN"));
  EXPECT_TRUE(busy("IDLE+COMPLETING+DRAIN"));
  EXPECT_FALSE(busy("IDLE+DRAIN"));
  EXPECT_FALSE(busy("IDLE+DYNAMIC_NORM"));
  EXPECT_EQ(BusyLabelPatch(true), R"({"metadata":{"labels":{"slurm.gpulet.io/busy":"true"}}})");
}

CommandOutput Out(const std::string& out) { return CommandOutput{0, out, "", false}; }

TEST(PodNodeTest, TerminationDrainsWaitsForJobsAndDeletes) {
  auto runner = std::make_shared<FakeRunner>();
  PodNode node(runner, "slurmd-1");
  runner->On("scontrol show node -o slurmd-1", Out("NodeName=slurmd-1 State=ALLOCATED Reason=\n"));
  runner->On("scontrol update NodeName=slurmd-1 State=DRAIN Reason=gpulet: pod terminating",
             Out(""));
  Result<PodNode::DrainOutcome> d = node.DrainForTermination();
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(*d, PodNode::DrainOutcome::kDrained);

  runner->On("scontrol show node -o slurmd-1",
             Out("NodeName=slurmd-1 State=MIXED+DRAIN Reason=gpulet: pod terminating\n"));
  int polls = 0;
  Result<NodeStatus> idle = node.WaitIdle(std::chrono::milliseconds(10), [&](auto) {
    if (++polls == 2) {
      runner->On("scontrol show node -o slurmd-1",
                 Out("NodeName=slurmd-1 State=IDLE+DRAIN Reason=gpulet: pod terminating\n"));
    }
    return true;
  });
  ASSERT_TRUE(idle.ok()) << idle.status().message();
  EXPECT_EQ(polls, 2);
  EXPECT_EQ(idle->state, "IDLE+DRAIN");

  runner->On("scontrol delete nodename=slurmd-1", Out(""));
  EXPECT_TRUE(node.Delete().ok());
  EXPECT_EQ(runner->calls().back(), "scontrol delete nodename=slurmd-1");
}

TEST(PodNodeTest, AdminDrainIsKeptAndWaitCanGiveUp) {
  auto runner = std::make_shared<FakeRunner>();
  PodNode node(runner, "slurmd-0");
  runner->On(
      "scontrol show node -o slurmd-0",
      Out("NodeName=slurmd-0 State=MIXED+DRAIN Reason=bad fan [root@2026-12-01T00:00:00]\n"));
  Result<PodNode::DrainOutcome> d = node.DrainForTermination();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, PodNode::DrainOutcome::kAdminDrainKept);
  for (const std::string& c : runner->calls()) EXPECT_THAT(c, ::testing::Not(HasSubstr("update")));
  Result<NodeStatus> idle =
      node.WaitIdle(std::chrono::milliseconds(10), [](auto) { return false; });
  ASSERT_FALSE(idle.ok());
  EXPECT_THAT(idle.status().message(), HasSubstr("still has jobs (MIXED+DRAIN)"));
}

TEST(PodNodeTest, DeleteOfAGoneNodeSucceedsBusyFails) {
  auto runner = std::make_shared<FakeRunner>();
  PodNode node(runner, "slurmd-2");
  runner->On(
      "scontrol delete nodename=slurmd-2",
      CommandOutput{1, "", "delete_node nodename=slurmd-2: Invalid node name specified", false});
  EXPECT_TRUE(node.Delete().ok());
  runner->On(
      "scontrol delete nodename=slurmd-2",
      CommandOutput{1, "", "delete_node nodename=slurmd-2: Requested nodes are busy", false});
  Status s = node.Delete();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("Requested nodes are busy"));
}

}  // namespace
}  // namespace gpulet::slurm
