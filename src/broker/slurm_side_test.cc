// The Slurm adapter: parsing what Slurm 22.05 prints, failing closed, and the guarded resume.
#include "broker/slurm_side.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "slurm/fake_runner.h"

namespace gpulet::broker {
namespace {

using slurm::CommandOutput;
using slurm::testing::FakeRunner;
using ::testing::HasSubstr;

// Trimmed from a real `sinfo --json` of Slurm 22.05.8 (tests/slurm cluster).
const char* kSinfo = R"J({"meta":{},"errors":[],"nodes":[
 {"name":"gpua","state":"mixed","state_flags":[],"reason":"","alloc_cpus":1,
  "gres":"gpu:h100:4(S:0-1),shard:h100:16(S:0-1)","gres_used":"gpu:h100:2(IDX:0-1),mps:0,shard:h100:0(IDX:N/A)",
  "last_busy":1796252524},
 {"name":"gpub","state":"idle","state_flags":["DRAIN"],"reason":"gpulet-broker: lent to kubernetes",
  "alloc_cpus":0,"gres":"gpu:l4:2(S:0-1),mps:l4:200(S:0-1)",
  "gres_used":"gpu:l4:0(IDX:N/A),mps:l4:0(IDX:N/A),shard:l4:0(IDX:N/A)","last_busy":1796252000}]})J";

const char* kSqueue = R"J({"meta":{},"errors":[],"jobs":[
 {"job_id":2,"job_state":"PENDING","state_reason":"Resources","node_count":2,
  "tres_per_node":"gres:gpu:h100:4","tres_per_job":"","required_nodes":"gpu[01-02]"},
 {"job_id":3,"job_state":"RUNNING","state_reason":"None","node_count":1,
  "tres_per_node":"","tres_per_job":"gres:gpu:3","required_nodes":""}]})J";

TEST(SlurmSide, ParsesSinfoJson) {
  auto nodes = ParseSinfoJson(kSinfo, 5);
  ASSERT_TRUE(nodes.ok()) << nodes.status().message();
  const SlurmNode& a = nodes->at("gpua");
  EXPECT_EQ(a.state, "mixed");
  EXPECT_EQ(a.gpus, 4);
  EXPECT_EQ(a.gpus_used, 2);
  EXPECT_EQ(a.alloc_cpus, 1);
  EXPECT_EQ(a.last_busy, 1796252524000);
  const SlurmNode& b = nodes->at("gpub");
  EXPECT_TRUE(b.HasFlag("DRAIN"));
  EXPECT_TRUE(b.ReasonIsOurs());
  EXPECT_TRUE(b.Drained());
  EXPECT_EQ(b.gpus, 2);
  EXPECT_EQ(a.GpusOfType("h100"), 4);
  EXPECT_EQ(b.GpusOfType("h100"), 0);
  EXPECT_EQ(b.GpusOfType("l4"), 2);
  EXPECT_EQ(b.GpusOfType(""), 2);
  // 23.x prints the state as a list.
  auto newer = ParseSinfoJson(
      R"({"errors":[],"nodes":[{"name":"n","state":["IDLE","DRAIN"],"gres":"gpu:8"}]})", 7);
  ASSERT_TRUE(newer.ok());
  EXPECT_EQ(newer->at("n").state, "idle");
  EXPECT_TRUE(newer->at("n").HasFlag("DRAIN"));
  EXPECT_EQ(newer->at("n").last_busy, 7);
}

TEST(SlurmSide, ParsesSqueueJson) {
  auto jobs = ParseSqueueJson(kSqueue);
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id, "2");
  EXPECT_TRUE((*jobs)[0].CapacityBound());
  EXPECT_EQ((*jobs)[0].TotalGpus(), 8);
  EXPECT_EQ((*jobs)[0].gpu_type, "h100");
  EXPECT_EQ((*jobs)[1].gpu_type, "");
  EXPECT_EQ((*jobs)[0].required_nodes, (std::set<std::string>{"gpu01", "gpu02"}));
  EXPECT_FALSE((*jobs)[1].Pending());
  EXPECT_EQ((*jobs)[1].TotalGpus(), 3);
}

TEST(SlurmSide, BadJsonIsAnError) {
  EXPECT_FALSE(ParseSinfoJson("not json", 0).ok());
  EXPECT_FALSE(ParseSinfoJson(R"({"errors":[{"error":"x"}],"nodes":[]})", 0).ok());
  EXPECT_FALSE(ParseSinfoJson(R"({"errors":[],"nodes":[{"name":"n"}]})", 0).ok());
  EXPECT_FALSE(ParseSqueueJson(R"({"errors":[],"jobs":[{"job_state":"PENDING"}]})").ok());
  EXPECT_FALSE(
      ParseSqueueJson(
          R"({"errors":[],"jobs":[{"job_id":1,"job_state":"PENDING","required_nodes":"a[2-1]"}]})")
          .ok());
}

TEST(SlurmSide, ParsesReservations) {
  auto none = ParseReservations("No reservations in the system\n");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  auto r = ParseReservations(
      "ReservationName=maint StartTime=2026-12-03T10:00:00 EndTime=2026-12-03T11:00:00 "
      "Duration=01:00:00 Nodes=gpu[01-02] NodeCnt=2 Flags=MAINT\n");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].name, "maint");
  EXPECT_EQ((*r)[0].end - (*r)[0].start, 3600 * 1000);
  EXPECT_EQ((*r)[0].nodes, (std::set<std::string>{"gpu01", "gpu02"}));
  EXPECT_FALSE(ParseReservations("ReservationName=x StartTime=soon\n").ok());
}

TEST(SlurmSide, GpuCount) {
  EXPECT_EQ(GpuCount("gres:gpu:h100:4"), 4);
  EXPECT_EQ(GpuCount("gres:gpu:2"), 2);
  EXPECT_EQ(GpuCount("gres/gpu=3"), 3);
  EXPECT_EQ(GpuCount("gpu:h100:4(S:0-1),shard:h100:16(S:0-1)"), 4);
  EXPECT_EQ(GpuCount("shard:h100:16"), 0);
  EXPECT_EQ(GpuCount(""), 0);
}

TEST(SlurmSide, GpusByType) {
  using M = std::map<std::string, int>;
  EXPECT_EQ(GpusByType("gres:gpu:H100:4"), (M{{"h100", 4}}));
  EXPECT_EQ(GpusByType("gres:gpu:2"), (M{{"", 2}}));
  EXPECT_EQ(GpusByType("gres/gpu:l4=2"), (M{{"l4", 2}}));
  EXPECT_EQ(GpusByType("gres/gpu=3"), (M{{"", 3}}));
  EXPECT_EQ(GpusByType("gpu:1g.10gb:7(S:0),gpu:a100:1(S:1),shard:a100:4"),
            (M{{"1g.10gb", 7}, {"a100", 1}}));
  EXPECT_EQ(GpusByType("gpu:h100"), (M{{"h100", 1}}));
}

class SlurmSideRunner : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.nodes = {"gpua", "gpub"};
    runner_ = std::make_shared<FakeRunner>();
    runner_->On("sinfo --json", CommandOutput{0, kSinfo, ""});
    runner_->On("squeue --json", CommandOutput{0, kSqueue, ""});
    runner_->On("scontrol show reservation -o",
                CommandOutput{0, "No reservations in the system\n", ""});
  }
  BrokerConfig config_;
  std::shared_ptr<FakeRunner> runner_;
};

TEST_F(SlurmSideRunner, ObserveReadsAllThree) {
  SlurmSide side(runner_, config_);
  SlurmView v = side.Observe(1);
  ASSERT_TRUE(v.ok) << v.error;
  EXPECT_EQ(v.nodes.size(), 2u);
  EXPECT_EQ(v.jobs.size(), 2u);
}

TEST_F(SlurmSideRunner, AnyFailedReadMakesTheViewUnknown) {
  runner_->On("squeue --json",
              CommandOutput{1, "", "squeue: error: Unable to contact slurm controller"});
  SlurmView v = SlurmSide(runner_, config_).Observe(1);
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.error, HasSubstr("Unable to contact slurm controller"));
  EXPECT_TRUE(v.nodes.empty());
  runner_->On("squeue --json", CommandOutput{0, kSqueue, ""});
  runner_->On("scontrol show reservation -o", Status(ErrorCode::kUnavailable, "timed out"));
  EXPECT_FALSE(SlurmSide(runner_, config_).Observe(1).ok);
}

TEST_F(SlurmSideRunner, ResumesOnlyItsOwnDrain) {
  SlurmSide side(runner_, config_);
  runner_->On(
      "scontrol show node -o gpub",
      CommandOutput{
          0, "NodeName=gpub State=IDLE+DRAIN Reason=replace DIMM [root@2026-12-02T23:00:00]\n",
          ""});
  Result<bool> r = side.ResumeIfOurs("gpub");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(*r);
  for (const std::string& c : runner_->calls()) EXPECT_THAT(c, ::testing::Not(HasSubstr("RESUME")));
  runner_->On("scontrol show node -o gpub",
              CommandOutput{0,
                            "NodeName=gpub State=IDLE+DRAIN Reason=gpulet-broker: lent to "
                            "kubernetes [root@2026-12-02T23:00:00]\n",
                            ""});
  runner_->On("scontrol update NodeName=gpub State=RESUME", CommandOutput{0, "", ""});
  r = side.ResumeIfOurs("gpub");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(*r);
}

}  // namespace
}  // namespace gpulet::broker
