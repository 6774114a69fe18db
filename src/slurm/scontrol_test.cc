#include "slurm/scontrol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "slurm/drain.h"
#include "slurm/fake_runner.h"

namespace gpulet::slurm {
namespace {

using ::testing::ElementsAre;
using testing::FakeRunner;
using ::testing::HasSubstr;

// Captured from Slurm 22.05.8 (`scontrol show node -o n1`), shortened in the middle.
const char* kDrainedByUs =
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.89 "
    "Gres=gpu:h100:2(S:0-3),shard:h100:8(S:0-3) NodeAddr=127.0.0.1 NodeHostName=localhost "
    "Port=17819 Version=22.05.8 RealMemory=4000 AllocMem=0 FreeMem=23283 Sockets=8 Boards=1 "
    "State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu  CfgTRES=cpu=8,mem=4000M,billing=8 AllocTRES= CapWatts=n/a CurrentWatts=0 "
    "Reason=gpulet: GPU GPU-abc XID 79 [root@2026-12-02T17:07:23]\n";
const char* kIdle =
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1 Gres=gpu:h100:2 State=IDLE ThreadsPerCore=1 "
    "Partitions=gpu CfgTRES=cpu=8 AllocTRES= CapWatts=n/a\n";
const char* kAdminDrained =
    "NodeName=n1 Arch=x86_64 State=MIXED+DRAIN ThreadsPerCore=1 Partitions=gpu "
    "Reason=bad fan, ticket 42 [admin@2026-12-02T10:00:00]\n";

CommandOutput Ok(const std::string& out) { return {0, out, ""}; }

TEST(NodeStatus, ParsesStateAndReason) {
  Result<NodeStatus> s = ParseNodeStatus(kDrainedByUs);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->name, "n1");
  EXPECT_EQ(s->state, "IDLE+DRAIN");
  EXPECT_EQ(s->reason, "gpulet: GPU GPU-abc XID 79");
  EXPECT_TRUE(s->drained());
  EXPECT_TRUE(s->ours());
  Result<NodeStatus> idle = ParseNodeStatus(kIdle);
  ASSERT_TRUE(idle.ok());
  EXPECT_FALSE(idle->drained());
  EXPECT_EQ(idle->reason, "");
  Result<NodeStatus> admin = ParseNodeStatus(kAdminDrained);
  EXPECT_TRUE(admin->drained());
  EXPECT_FALSE(admin->ours());
  EXPECT_EQ(admin->reason, "bad fan, ticket 42");
  EXPECT_FALSE(ParseNodeStatus("garbage").ok());
}

TEST(SlurmClient, MapsFailuresToClearErrors) {
  auto runner = std::make_shared<FakeRunner>();
  SlurmClient client(runner);
  runner->On("scontrol show node -o n1",
             CommandOutput{1, "",
                           "slurm_load_node error: Unable to contact slurm controller (connect "
                           "failure)\n"});
  Result<NodeStatus> down = client.ShowNode("n1");
  EXPECT_EQ(down.status().code(), ErrorCode::kUnavailable);
  EXPECT_THAT(down.status().message(), HasSubstr("slurmctld not reachable"));

  runner->On("scontrol show node -o nX", CommandOutput{1, "", "Node nX not found\n"});
  EXPECT_EQ(client.ShowNode("nX").status().code(), ErrorCode::kNotFound);

  runner->On("scontrol show node -o n1",
             Result<CommandOutput>(ErrorCode::kNotFound, "scontrol: command not found"));
  EXPECT_EQ(client.ShowNode("n1").status().code(), ErrorCode::kNotFound);
}

gpu::HealthSnapshot Snapshot(std::map<std::string, gpu::DeviceHealth> devices) {
  gpu::HealthSnapshot s;
  s.version = 1;
  s.devices = std::move(devices);
  return s;
}

const gpu::HealthSnapshot kHealthy = Snapshot({{"GPU-a", {}}, {"GPU-b", {}}});
const gpu::HealthSnapshot kXid = Snapshot({{"GPU-a", {}}, {"GPU-b", {false, "XID 79"}}});

TEST(DrainReason, NamesFirstUnhealthyDeviceAndCount) {
  EXPECT_EQ(DrainReason(kHealthy), "");
  EXPECT_EQ(DrainReason(kXid), "gpulet: GPU GPU-b XID 79");
  EXPECT_EQ(
      DrainReason(Snapshot({{"GPU-a", {false, "GPU is lost"}}, {"MIG-c", {false, "XID 79"}}})),
      "gpulet: GPU GPU-a GPU is lost (+1 more)");
  EXPECT_EQ(DrainReason(Snapshot({{"MIG-c", {false, ""}}})), "gpulet: MIG device MIG-c unhealthy");
}

TEST(NodeDrainer, DrainsHealthyNodeOnBadGpu) {
  auto runner = std::make_shared<FakeRunner>();
  SlurmClient client(runner);
  NodeDrainer drainer(client, "n1");
  runner->On("scontrol show node -o n1", Ok(kIdle));
  runner->On("scontrol update NodeName=n1 State=DRAIN Reason=gpulet: GPU GPU-b XID 79", Ok(""));
  Result<DrainAction> a = drainer.Reconcile(kXid);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(*a, DrainAction::kDrained);
  EXPECT_THAT(
      runner->calls(),
      ElementsAre("scontrol show node -o n1",
                  "scontrol update NodeName=n1 State=DRAIN Reason=gpulet: GPU GPU-b XID 79"));
}

TEST(NodeDrainer, ResumesOnlyItsOwnDrain) {
  auto runner = std::make_shared<FakeRunner>();
  SlurmClient client(runner);
  NodeDrainer drainer(client, "n1");
  runner->On("scontrol update NodeName=n1 State=RESUME", Ok(""));

  runner->On("scontrol show node -o n1", Ok(kDrainedByUs));
  EXPECT_EQ(*drainer.Reconcile(kHealthy), DrainAction::kResumed);

  runner->On("scontrol show node -o n1", Ok(kAdminDrained));
  EXPECT_EQ(*drainer.Reconcile(kHealthy), DrainAction::kLeftAdminDrain);
  // An admin drain is not overwritten by ours either.
  EXPECT_EQ(*drainer.Reconcile(kXid), DrainAction::kLeftAdminDrain);

  runner->On("scontrol show node -o n1", Ok(kIdle));
  EXPECT_EQ(*drainer.Reconcile(kHealthy), DrainAction::kNone);

  int resumes = 0, drains = 0;
  for (const std::string& c : runner->calls()) {
    resumes += c.find("State=RESUME") != std::string::npos;
    drains += c.find("State=DRAIN") != std::string::npos;
  }
  EXPECT_EQ(resumes, 1);
  EXPECT_EQ(drains, 0);
}

TEST(NodeDrainer, KeepsOrUpdatesItsReason) {
  auto runner = std::make_shared<FakeRunner>();
  SlurmClient client(runner);
  NodeDrainer drainer(client, "n1");
  runner->On("scontrol show node -o n1", Ok(kDrainedByUs));
  // Same reason: nothing to do.
  EXPECT_EQ(*drainer.Reconcile(Snapshot({{"GPU-abc", {false, "XID 79"}}})), DrainAction::kNone);
  runner->On("scontrol update NodeName=n1 State=DRAIN Reason=gpulet: GPU GPU-b XID 79", Ok(""));
  EXPECT_EQ(*drainer.Reconcile(kXid), DrainAction::kReasonUpdated);
}

TEST(NodeDrainer, ControllerDownChangesNothing) {
  auto runner = std::make_shared<FakeRunner>();
  SlurmClient client(runner);
  NodeDrainer drainer(client, "n1");
  runner->On("scontrol show node -o n1",
             CommandOutput{1, "", "slurm_load_node error: Unable to contact slurm controller"});
  for (const gpu::HealthSnapshot* s : {&kXid, &kHealthy}) {
    Result<DrainAction> a = drainer.Reconcile(*s);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), ErrorCode::kUnavailable);
  }
  EXPECT_THAT(runner->calls(), ElementsAre("scontrol show node -o n1", "scontrol show node -o n1"));
}

}  // namespace
}  // namespace gpulet::slurm
