// Command-line habits of a new user: global flags on either side of the subcommand, and an
// unknown subcommand named in the error (with the closest known one), never top-level help.
#include <gtest/gtest.h>

#include "run_command.h"

namespace gpulet::testing {
namespace {

TEST(CliHabits, GlobalFlagsAfterTheSubcommand) {
  const CommandResult before = RunCommand(GpuletBinary() + " --simulate dgx-h100 info");
  const CommandResult after = RunCommand(GpuletBinary() + " info --simulate dgx-h100");
  ASSERT_EQ(after.exit_code, 0) << after.output;
  EXPECT_EQ(before.exit_code, 0) << before.output;
  EXPECT_NE(after.output.find("NVIDIA H100 80GB HBM3"), std::string::npos) << after.output;
  // Nested subcommands too.
  const CommandResult gres = RunCommand(GpuletBinary() + " slurm gres --simulate dgx-h100");
  EXPECT_EQ(gres.exit_code, 0) << gres.output;
  EXPECT_NE(gres.output.find("Gres=gpu:h100:8"), std::string::npos) << gres.output;
}

TEST(CliHabits, UnknownSubcommandIsNamedWithASuggestion) {
  const CommandResult typo = RunCommand(GpuletBinary() + " infp");
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.output.find("unknown command \"infp\"; did you mean \"info\"?"), std::string::npos)
      << typo.output;
  const CommandResult none = RunCommand(GpuletBinary() + " nosuchcmd");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.output.find("unknown command \"nosuchcmd\""), std::string::npos) << none.output;
  EXPECT_EQ(none.output.find("A subcommand is required"), std::string::npos) << none.output;
  // --help after an unknown command is not the top-level help with exit 0.
  const CommandResult help = RunCommand(GpuletBinary() + " extendr --help");
  EXPECT_EQ(help.exit_code, 2) << help.output;
  EXPECT_NE(help.output.find("unknown command \"extendr\""), std::string::npos) << help.output;
  EXPECT_EQ(help.output.find("Usage:"), std::string::npos) << help.output;
  // A global option's value is not taken for the subcommand.
  const CommandResult level = RunCommand(GpuletBinary() + " --log-level warn version");
  EXPECT_EQ(level.exit_code, 0) << level.output;
}

}  // namespace
}  // namespace gpulet::testing
