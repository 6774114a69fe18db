// `gpulet slurm` as a user runs it, on simulated nodes, without a Slurm cluster.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/slurm/slurm_test_support.h"

namespace gpulet::slurm_testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class SlurmCli : public ::testing::Test {
 protected:
  std::string Gpulet(const std::string& fixture) const {
    return GpuletBinary() + " --simulate " + fixture + " --sim-state " + dir_.path() + "/sim";
  }
  TempDir dir_;
};

TEST_F(SlurmCli, GresForDgxH100) {
  CommandResult r = RunCommand(Gpulet("dgx-h100") + " slurm gres --node-name dgx01");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("AutoDetect=off\n"));
  EXPECT_THAT(r.output, HasSubstr("from driver 550.54.15 (simulated, fixture "));
  EXPECT_THAT(r.output, ::testing::ContainsRegex(
                            "NodeName=dgx01 Name=gpu Type=h100 File=/dev/nvidia0 Cores=[0-9,-]+ "
                            "Links=-1,18,18,18,18,18,18,18\n"));
  EXPECT_THAT(r.output, ::testing::ContainsRegex("# slurm.conf: NodeName=dgx01 CPUs=224 "
                                                 "RealMemory=[0-9]+ Gres=gpu:h100:8\n"));
  EXPECT_THAT(r.output, HasSubstr("# slurm.conf: GresTypes=gpu\n"));
}

TEST_F(SlurmCli, GresForMigAndPcieNodes) {
  CommandResult a100 = RunCommand(Gpulet("dgx-a100") + " slurm gres --node-name a1 --print gres");
  ASSERT_EQ(a100.exit_code, 0) << a100.output;
  if (a100.output.find("MultipleFiles=") != std::string::npos) {
    EXPECT_THAT(a100.output,
                ::testing::ContainsRegex(
                    "Name=gpu Type=a100_[0-9a-z.]+ MultipleFiles=/dev/nvidia[0-9]+,"
                    "/dev/nvidia-caps/nvidia-cap[0-9]+,/dev/nvidia-caps/nvidia-cap[0-9]+"));
  }
  TempDir other;
  CommandResult l4 = RunCommand(GpuletBinary() + " --simulate l4-pcie --sim-state " + other.path() +
                                " slurm gres --node-name l4n --shards 3 --print slurm");
  ASSERT_EQ(l4.exit_code, 0) << l4.output;
  EXPECT_THAT(l4.output, HasSubstr("GresTypes=gpu,shard\n"));
  EXPECT_THAT(l4.output, ::testing::ContainsRegex("NodeName=l4n CPUs=128 RealMemory=[0-9]+ "
                                                  "Gres=gpu:l4:4,shard:12\n"));
}

TEST_F(SlurmCli, CheckMatchingAndMismatchingFiles) {
  const std::string file = dir_.path() + "/gres.conf";
  CommandResult gen = RunCommand(Gpulet("dgx-h100") + " slurm gres --node-name dgx01 -o " + file);
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  // Written atomically: no temporary file left beside it.
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
    EXPECT_THAT(e.path().filename().string(), Not(HasSubstr(".gres.conf."))) << e.path();
  }
  CommandResult ok =
      RunCommand(Gpulet("dgx-h100") + " slurm gres --node-name dgx01 --check " + file);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_THAT(ok.output, HasSubstr("matches the hardware of node dgx01 (8 GRES records)"));

  // Edit: a wrong type on GPU 2, GPU 7 gone, a GPU that does not exist.
  std::string text = ReadFile(file), edited;
  std::stringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l.find("File=/dev/nvidia7 ") != std::string::npos) continue;
    if (l.find("File=/dev/nvidia2 ") != std::string::npos) {
      l.replace(l.find("Type=h100"), 9, "Type=a100");
    }
    edited += l + "\n";
  }
  edited += "NodeName=dgx01 Name=gpu Type=h100 File=/dev/nvidia8\n";
  WriteFile(file, edited);
  CommandResult bad =
      RunCommand(Gpulet("dgx-h100") + " slurm gres --node-name dgx01 --check " + file);
  EXPECT_EQ(bad.exit_code, 3) << bad.output;
  EXPECT_THAT(bad.output, ::testing::ContainsRegex(
                              file + ":[0-9]+: Name=gpu Type=a100 File=/dev/nvidia2: Type is a100, "
                                     "hardware has h100"));
  EXPECT_THAT(bad.output, HasSubstr("Name=gpu Type=h100 File=/dev/nvidia8: no such device"));
  EXPECT_THAT(bad.output, HasSubstr("missing: Name=gpu Type=h100 File=/dev/nvidia7"));
  EXPECT_THAT(bad.output, HasSubstr("3 mismatch(es) with the hardware of node dgx01"));
}

TEST_F(SlurmCli, BadInputIsAClearError) {
  CommandResult name = RunCommand(Gpulet("dgx-h100") + " slurm gres --node-name node_01");
  EXPECT_EQ(name.exit_code, 2) << name.output;
  EXPECT_THAT(name.output, HasSubstr("\"node_01\": not a valid Slurm hostname"));

  CommandResult missing = RunCommand(Gpulet("dgx-h100") + " slurm gres --node-name n1 --check " +
                                     dir_.path() + "/nope.conf");
  EXPECT_EQ(missing.exit_code, 4) << missing.output;

  WriteFile(dir_.path() + "/broken.conf", "AutoDetect=off\nName=gpu Cores=x File=/dev/nvidia0\n");
  CommandResult broken = RunCommand(Gpulet("dgx-h100") + " slurm gres --node-name n1 --check " +
                                    dir_.path() + "/broken.conf");
  EXPECT_EQ(broken.exit_code, 3) << broken.output;
  EXPECT_THAT(broken.output, HasSubstr("broken.conf:2: Cores:"));

  // The output file is not touched when generation fails.
  WriteFile(dir_.path() + "/keep.conf", "previous\n");
  CommandResult fail = RunCommand(Gpulet("dgx-h100") + " slurm gres --node-name bad_name -o " +
                                  dir_.path() + "/keep.conf");
  EXPECT_NE(fail.exit_code, 0);
  EXPECT_EQ(ReadFile(dir_.path() + "/keep.conf"), "previous\n");
}

TEST_F(SlurmCli, HealthWithoutScontrolIsAClearError) {
  CommandResult r = RunCommand(Gpulet("dgx-h100") +
                               " slurm health --node-name n1 --scontrol /nonexistent/scontrol");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_THAT(r.output, HasSubstr("/nonexistent/scontrol: command not found"));
}

TEST_F(SlurmCli, Help) {
  CommandResult r = RunCommand(GpuletBinary() + " slurm --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* sub : {"gres", "health", "jobs"}) EXPECT_THAT(r.output, HasSubstr(sub));
  r = RunCommand(GpuletBinary() + " slurm gres --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--node-name", "--dev-root", "--shards", "--mps", "--type-override",
                           "--check", "--output", "GPULET_SLURM_NODE_NAME"}) {
    EXPECT_THAT(r.output, HasSubstr(flag));
  }
}

}  // namespace
}  // namespace gpulet::slurm_testing
