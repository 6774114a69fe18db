#include "slurm/command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpulet::slurm {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(ProcessRunner, CapturesOutputAndExitCode) {
  ProcessRunner r;
  Result<CommandOutput> out = r.Run({"sh", "-c", "echo hello; echo oops >&2; exit 3"}, 10s);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->exit_code, 3);
  EXPECT_EQ(out->out, "hello\n");
  EXPECT_EQ(out->err, "oops\n");
}

TEST(ProcessRunner, LargeOutputOnBothStreams) {
  ProcessRunner r;
  Result<CommandOutput> out =
      r.Run({"sh", "-c", "head -c 200000 /dev/zero; head -c 100000 /dev/zero >&2"}, 10s);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->out.size(), 200000u);
  EXPECT_EQ(out->err.size(), 100000u);
}

TEST(ProcessRunner, MissingProgramIsNotFound) {
  ProcessRunner r;
  Result<CommandOutput> out = r.Run({"gpulet-no-such-program-xyz"}, 10s);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), ErrorCode::kNotFound);
  EXPECT_THAT(out.status().message(), HasSubstr("gpulet-no-such-program-xyz"));
}

TEST(ProcessRunner, HungProgramIsKilledAtTheDeadline) {
  ProcessRunner r;
  Result<CommandOutput> out = r.Run({"sleep", "30"}, 200ms);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), ErrorCode::kUnavailable);
}

}  // namespace
}  // namespace gpulet::slurm
