// `gpulet slurm health`'s decision loop on a FakeClock, with scontrol scripted by FakeRunner: when
// it reconciles, re-checks and retries, without sleeping.
#include "slurm/health_loop.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "slurm/fake_runner.h"

namespace gpulet::slurm {
namespace {

using namespace std::chrono_literals;
using testing::FakeRunner;

const char* kIdle = "NodeName=n1 Arch=x86_64 Gres=gpu:h100:2 State=IDLE Partitions=gpu\n";
const char* kDrainedByUs =
    "NodeName=n1 Arch=x86_64 State=IDLE+DRAIN Partitions=gpu "
    "Reason=gpulet: GPU GPU-b XID 79 [root@2026-12-02T17:07:23]\n";

CommandOutput Ok(const std::string& out) { return {0, out, ""}; }

class HealthLoopTest : public ::testing::Test {
 protected:
  HealthLoopTest() : client_(runner_), drainer_(client_, "n1") {
    runner_->On("scontrol show node -o n1", Ok(kIdle));
    options_.probe_interval = 1s;
    options_.resync = 30s;
    options_.retry_cap = 5s;
  }
  size_t ShowCalls() const {
    size_t n = 0;
    for (const std::string& c : runner_->calls()) n += c == "scontrol show node -o n1";
    return n;
  }

  std::shared_ptr<FakeRunner> runner_ = std::make_shared<FakeRunner>();
  SlurmClient client_;
  NodeDrainer drainer_;
  gpu::HealthBoard board_;
  FakeClock clock_;
  HealthLoopOptions options_;
};

TEST_F(HealthLoopTest, FirstDecisionWaitsTwoProbes) {
  HealthLoop loop(drainer_, board_, clock_, options_);
  EXPECT_FALSE(loop.Tick());
  clock_.Advance(1999ms);
  EXPECT_FALSE(loop.Tick());
  EXPECT_EQ(ShowCalls(), 0u);  // nothing asked of Slurm yet
  clock_.Advance(1ms);
  auto a = loop.Tick();
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->ok()) << a->status().message();
  EXPECT_EQ(**a, DrainAction::kNone);
  EXPECT_EQ(ShowCalls(), 1u);
}

TEST_F(HealthLoopTest, QuietNodeIsRecheckedEveryResync) {
  HealthLoop loop(drainer_, board_, clock_, options_);
  clock_.Advance(2s);
  ASSERT_TRUE(loop.Tick());
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(2900ms);  // 29 s in all
    EXPECT_FALSE(loop.Tick()) << i;
  }
  clock_.Advance(1s);
  EXPECT_TRUE(loop.Tick());
  EXPECT_EQ(loop.reconciles(), 2u);
  EXPECT_EQ(ShowCalls(), 2u);
}

TEST_F(HealthLoopTest, NewHealthVersionDrainsAtTheNextTickThenResumes) {
  HealthLoop loop(drainer_, board_, clock_, options_);
  clock_.Advance(2s);
  ASSERT_TRUE(loop.Tick());
  clock_.Advance(200ms);
  EXPECT_FALSE(loop.Tick());  // no news, resync far away

  ASSERT_TRUE(board_.Update({{"GPU-b", gpu::DeviceHealth{false, "XID 79"}}}));
  runner_->On("scontrol update NodeName=n1 State=DRAIN Reason=gpulet: GPU GPU-b XID 79", Ok(""));
  clock_.Advance(200ms);
  auto a = loop.Tick();
  ASSERT_TRUE(a && a->ok());
  EXPECT_EQ(**a, DrainAction::kDrained);

  // Healthy again: resumed at the next tick, because the drain is still ours.
  runner_->On("scontrol show node -o n1", Ok(kDrainedByUs));
  runner_->On("scontrol update NodeName=n1 State=RESUME", Ok(""));
  ASSERT_TRUE(board_.Update({{"GPU-b", gpu::DeviceHealth{}}}));
  clock_.Advance(200ms);
  a = loop.Tick();
  ASSERT_TRUE(a && a->ok());
  EXPECT_EQ(**a, DrainAction::kResumed);
  EXPECT_THAT(runner_->calls(), ::testing::Contains("scontrol update NodeName=n1 State=RESUME"));
}

TEST_F(HealthLoopTest, ControllerDownIsRetriedAfterTheRetryCap) {
  runner_->On("scontrol show node -o n1",
              CommandOutput{1, "", "slurm_load_node error: Unable to contact slurm controller"});
  HealthLoop loop(drainer_, board_, clock_, options_);
  clock_.Advance(2s);
  auto a = loop.Tick();
  ASSERT_TRUE(a);
  EXPECT_FALSE(a->ok());
  EXPECT_EQ(a->status().code(), ErrorCode::kUnavailable);
  clock_.Advance(4999ms);
  EXPECT_FALSE(loop.Tick());
  EXPECT_EQ(ShowCalls(), 1u);
  clock_.Advance(1ms);
  runner_->On("scontrol show node -o n1", Ok(kIdle));
  a = loop.Tick();
  ASSERT_TRUE(a && a->ok());
  EXPECT_EQ(ShowCalls(), 2u);
  // Back to normal: the next check waits a full resync.
  clock_.Advance(29s);
  EXPECT_FALSE(loop.Tick());
}

// A resync shorter than the retry cap bounds the retry too.
TEST_F(HealthLoopTest, RetryNeverWaitsLongerThanResync) {
  runner_->On("scontrol show node -o n1", CommandOutput{127, "", "scontrol: not found"});
  options_.resync = 2s;
  HealthLoop loop(drainer_, board_, clock_, options_);
  clock_.Advance(2s);
  ASSERT_TRUE(loop.Tick());
  clock_.Advance(1999ms);
  EXPECT_FALSE(loop.Tick());
  clock_.Advance(1ms);
  EXPECT_TRUE(loop.Tick());
}

}  // namespace
}  // namespace gpulet::slurm
