#include "slurm/jobs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/clock.h"
#include "slurm/fake_runner.h"

namespace gpulet::slurm {
namespace {

using testing::FakeRunner;
using ::testing::HasSubstr;

// Shapes captured from Slurm 22.05.8 `scontrol show job -d -o` (fields between trimmed).
const char* kJobs =
    "JobId=1 JobName=wrap UserId=root(0) JobState=RUNNING Reason=None NodeList=n1 BatchHost=n1 "
    "NumNodes=1 NumCPUs=1 TRES=cpu=1,mem=100M,node=1 JOB_GRES=shard:3   Nodes=n1 CPU_IDs=0 "
    "Mem=100 GRES=shard:3(IDX:0) MinCPUsNode=1 TresPerNode=gres:shard:3 \n"
    "JobId=2 JobName=wrap JobState=CANCELLED Reason=None NodeList=(null) NumNodes=1 \n"
    "JobId=8 JobName=wrap JobState=RUNNING NodeList=n1 NumNodes=1 JOB_GRES=gpu:h100:1   "
    "Nodes=n1 CPU_IDs=1 Mem=100 GRES=gpu:h100:1(IDX:1) MinCPUsNode=1 \n"
    "JobId=9 JobName=wrap JobState=RUNNING NodeList=n2 NumNodes=1 JOB_GRES=mps:50   Nodes=n2 "
    "CPU_IDs=1 Mem=100 GRES=mps:50(IDX:0) MinCPUsNode=1 \n"
    "JobId=12 JobState=RUNNING NodeList=n[1-2] NumNodes=2 JOB_GRES=gpu:h100:4   Nodes=n[1-2] "
    "CPU_IDs=0-1 Mem=200 GRES=gpu:h100:3(IDX:2-3,5),gpu:l4:0(IDX:) MinCPUsNode=1 \n"
    "JobId=13 JobState=COMPLETED NodeList=n1 JOB_GRES=gpu:h100:1   Nodes=n1 CPU_IDs=0 Mem=100 "
    "GRES=gpu:h100:1(IDX:4) \n"
    "JobId=14 JobState=RUNNING NodeList=n2,n1 JOB_GRES=gpu:2   Nodes=n2 CPU_IDs=0 Mem=100 "
    "GRES=gpu(IDX:1)   Nodes=n1 CPU_IDs=0 Mem=100 GRES=gpu(IDX:0,6) \n";

TEST(JobGpus, ParsesIndexesPerNode) {
  Result<JobsByGpuMap> n1 = ParseJobGpus(kJobs, "n1", {});
  ASSERT_TRUE(n1.ok()) << n1.status().message();
  EXPECT_EQ(*n1, (JobsByGpuMap{{0, "1,14"}, {1, "8"}, {2, "12"}, {3, "12"}, {5, "12"}, {6, "14"}}));
  Result<JobsByGpuMap> n2 = ParseJobGpus(kJobs, "n2", {});
  ASSERT_TRUE(n2.ok());
  EXPECT_EQ(*n2, (JobsByGpuMap{{0, "9"}, {1, "14"}, {2, "12"}, {3, "12"}, {5, "12"}}));
  EXPECT_TRUE(ParseJobGpus(kJobs, "n3", {})->empty());
  EXPECT_TRUE(ParseJobGpus("No jobs in the system\n", "n1", {})->empty());
}

TEST(JobGpus, MapsGresIndexesToGpus) {
  // GPU 0 in MIG mode with two devices (gpu indexes 0,1), GPU 1 whole (gpu index 2); shards only
  // on GPU 1 (shard index 0).
  std::map<std::string, std::vector<unsigned>> idx{{"gpu", {0, 0, 1}}, {"shard", {1}}};
  Result<JobsByGpuMap> m = ParseJobGpus(
      "JobId=3 JobState=RUNNING Nodes=a1 GRES=gpu:a100_3g.20gb:1(IDX:1)\n"
      "JobId=4 JobState=RUNNING Nodes=a1 GRES=shard:2(IDX:0)\n",
      "a1", idx);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, (JobsByGpuMap{{0, "3"}, {1, "4"}}));
}

TEST(JobGpus, BadIndexDataIsAnError) {
  Result<JobsByGpuMap> m =
      ParseJobGpus("JobId=3 JobState=RUNNING Nodes=n1 GRES=gpu:h100:1(IDX:x)\n", "n1", {});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kInvalidInput);
  EXPECT_THAT(m.status().message(), HasSubstr("job 3"));
}

TEST(JobGpus, NodeListsWithRangesAndPadding) {
  const std::string line = "JobId=5 JobState=RUNNING Nodes=gpu[01-03,10],cpu7 GRES=gpu(IDX:0)\n";
  for (const char* yes : {"gpu01", "gpu03", "gpu10", "cpu7"}) {
    EXPECT_EQ(ParseJobGpus(line, yes, {})->size(), 1u) << yes;
  }
  for (const char* no : {"gpu04", "gpu1", "cpu", "gpu010"}) {
    EXPECT_TRUE(ParseJobGpus(line, no, {})->empty()) << no;
  }
}

TEST(JobGpus, GresIndexesFromGeneratedRecords) {
  gpu::Inventory inv;
  for (unsigned i = 0; i < 2; ++i) {
    gpu::Gpu g;
    g.index = i;
    g.minor = i;
    g.name = "NVIDIA A100-SXM4-40GB";
    inv.gpus.push_back(g);
  }
  inv.links.assign(2, std::vector<gpu::Link>(2));
  inv.gpus[0].mig_enabled = true;
  for (unsigned m = 0; m < 2; ++m) {
    gpu::MigDevice d;
    d.mig_index = m;
    d.profile = "3g.20gb";
    d.gi_cap_path = "/dev/nvidia-caps/nvidia-cap1" + std::to_string(m);
    d.ci_cap_path = "/dev/nvidia-caps/nvidia-cap2" + std::to_string(m);
    inv.gpus[0].mig_devices.push_back(d);
  }
  GresOptions o;
  o.node_name = "a1";
  o.dev_root = "/tmp/r";
  o.shards = 2;
  Result<NodeGres> g = PlanNodeGres(inv, o);
  ASSERT_TRUE(g.ok());
  auto idx = GresGpuIndexes(inv, *g);
  EXPECT_EQ(idx["gpu"], (std::vector<unsigned>{0, 0, 1}));
  EXPECT_EQ(idx["shard"], (std::vector<unsigned>{1}));
}

TEST(JobMapper, RefreshKeepsLastGoodMap) {
  auto runner = std::make_shared<FakeRunner>();
  JobMapper mapper(runner, {"n1", std::chrono::milliseconds(10), "scontrol"}, {});
  EXPECT_TRUE(mapper.JobsByGpu().empty());
  runner->On("scontrol show job -d -o", CommandOutput{0, kJobs, ""});
  ASSERT_TRUE(mapper.Refresh().ok());
  EXPECT_EQ(mapper.JobsByGpu().at(1), "8");
  runner->On("scontrol show job -d -o",
             CommandOutput{1, "", "slurm_load_jobs error: Unable to contact slurm controller"});
  Status s = mapper.Refresh();
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable);
  EXPECT_EQ(mapper.JobsByGpu().at(1), "8");
}

TEST(JobMapper, BackgroundRefreshStartsAndStops) {
  auto runner = std::make_shared<FakeRunner>();
  runner->On("scontrol show job -d -o", CommandOutput{0, kJobs, ""});
  FakeClock clock;
  JobMapper mapper(runner, {"n2", std::chrono::seconds(10), "scontrol"}, {}, clock);
  mapper.Start();
  ASSERT_TRUE(clock.WaitForSleepers(1));  // the first refresh is done, the next one waits
  EXPECT_EQ(mapper.JobsByGpu().at(0), "9");
  EXPECT_EQ(runner->calls().size(), 1u);
  // Not before the interval…
  clock.Advance(std::chrono::seconds(9));
  ASSERT_TRUE(clock.WaitForSleepers(1));
  EXPECT_EQ(runner->calls().size(), 1u);
  // …then exactly once more.
  clock.Advance(std::chrono::seconds(1));
  for (int i = 0; i < 3000 && runner->calls().size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // bounded wait for the thread
  }
  EXPECT_EQ(runner->calls().size(), 2u);
  mapper.Stop();
  // Stopped: however much time passes, no more refreshes.
  clock.Advance(std::chrono::hours(1));
  EXPECT_EQ(clock.sleepers(), 0u);
  EXPECT_EQ(runner->calls().size(), 2u);
}

}  // namespace
}  // namespace gpulet::slurm
