// Cores= in gres.conf are Slurm's logical core indices, on a simulated host whose CPU numbering
// alternates between sockets (testing/fixtures/l4-alternating.yaml): not OS CPU ids folded by the
// core count.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "run_command.h"

namespace gpulet::testing {
namespace {

TEST(SlurmCores, AlternatingCpuNumberingGivesLogicalCoreIndices) {
  std::string state = "/tmp/gpulet-slurmcores-XXXXXX";
  ASSERT_NE(mkdtemp(state.data()), nullptr);
  const CommandResult r = RunCommand(GpuletBinary() + " slurm gres --simulate l4-alternating --sim-state " +
                                     state + " --node-name n1 2>/dev/null");
  std::filesystem::remove_all(state);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("File=/dev/nvidia0 Cores=0-7\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("File=/dev/nvidia2 Cores=8-15\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("File=/dev/nvidia3 Cores=8-15\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CPUs=32 ThreadsPerCore=2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gpulet::testing
