// `gpulet labels`: GFD's node labels as an NFD feature file, through the real binary.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <map>
#include <sstream>

#include "run_command.h"

namespace gpulet::testing {
namespace {

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-labels-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

std::map<std::string, std::string> ReadFeatureFile(const std::string& path) {
  std::map<std::string, std::string> labels;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) labels[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return labels;
}

class LabelsCommand : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = TempDir(); }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string Labels(const std::string& fixture, const std::string& args) {
    return GpuletBinary() + " --simulate " + fixture + " --sim-state " + dir_ + "/state labels " +
           "--machine-type-file " + dir_ + "/product_name " + args;
  }
  std::string dir_;
};

TEST_F(LabelsCommand, OneshotWritesGfdLabelsForDgxH100) {
  std::ofstream(dir_ + "/product_name") << "DGX H100\n";
  const std::string out = dir_ + "/gfd";
  CommandResult r = RunCommand(Labels("dgx-h100", "--oneshot -o " + out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto l = ReadFeatureFile(out);
  EXPECT_EQ(l["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(l["nvidia.com/gpu.count"], "8");
  EXPECT_EQ(l["nvidia.com/gpu.machine"], "DGX-H100");
  EXPECT_EQ(l["nvidia.com/gpu.family"], "hopper");
  EXPECT_EQ(l["nvidia.com/gpu.sharing-strategy"], "none");
  EXPECT_FALSE(l["nvidia.com/gfd.timestamp"].empty());
}

TEST_F(LabelsCommand, StdoutAndNoTimestampWithEnvironmentVariables) {
  CommandResult r = RunCommand("GFD_ONESHOT=true GFD_NO_TIMESTAMP=true " +
                               Labels("l4-pcie", "-o - 2>/dev/null"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nvidia.com/gpu.product=NVIDIA-L4\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("nvidia.com/mig.capable=false\n"), std::string::npos);
  EXPECT_EQ(r.output.find("gfd.timestamp"), std::string::npos);
}

TEST_F(LabelsCommand, BadConfigNamesFileLineAndFieldAndKeepsTheOldFile) {
  const std::string out = dir_ + "/gfd";
  std::ofstream(out) << "nvidia.com/gpu.count=8\n";
  std::ofstream(dir_ + "/config.yaml") << "version: v1\nflags:\n  migStrategy: sometimes\n";
  CommandResult r =
      RunCommand(Labels("dgx-h100", "--oneshot -o " + out + " --config-file " + dir_ + "/config.yaml"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("config.yaml:3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("migStrategy"), std::string::npos) << r.output;
  EXPECT_EQ(ReadFeatureFile(out)["nvidia.com/gpu.count"], "8");
}

TEST_F(LabelsCommand, MissingOutputDirectoryIsAnError) {
  CommandResult r = RunCommand(Labels("dgx-h100", "--oneshot -o " + dir_ + "/nope/gfd"));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find(dir_ + "/nope"), std::string::npos) << r.output;
}

TEST_F(LabelsCommand, DaemonModeRelabelsUntilSigterm) {
  const std::string out = dir_ + "/gfd";
  // Runs in the background, waits (bounded) for the first file, removes it, waits for the next
  // pass to write it again, then stops the loop with SIGTERM.
  const std::string script = Labels("dgx-h100", "--sleep-interval 1s -o " + out) +
                             " 2>/dev/null & pid=$!; "
                             "for i in $(seq 200); do [ -f " + out + " ] && break; sleep 0.05; done; "
                             "rm -f " + out + "; "
                             "for i in $(seq 200); do [ -f " + out + " ] && break; sleep 0.05; done; "
                             "[ -f " + out + " ] && echo rewritten; "
                             "kill -TERM $pid; wait $pid; echo rc=$?";
  CommandResult r = RunCommand("sh -c '" + script + "'");
  EXPECT_NE(r.output.find("rewritten"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rc=0"), std::string::npos) << r.output;
  EXPECT_EQ(ReadFeatureFile(out)["nvidia.com/gpu.count"], "8");
}

TEST_F(LabelsCommand, BadSleepIntervalIsAUsageError) {
  CommandResult r = RunCommand(Labels("dgx-h100", "--sleep-interval soon -o -"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--sleep-interval"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gpulet::testing
