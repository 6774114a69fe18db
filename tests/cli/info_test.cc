// `gpulet info` and the discovery faults, through the real binary.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "run_command.h"

namespace gpulet::testing {
namespace {

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-cli-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

std::string Gpulet(const std::string& args) { return GpuletBinary() + " " + args; }

TEST(InfoCommand, JsonOnDgxH100ListsEightGpusWithUuidsMemoryAndNvlinkMatrix) {
  const std::string state = TempDir();
  CommandResult r =
      RunCommand(Gpulet("--simulate dgx-h100 --sim-state " + state + " info --output json 2>/dev/null"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["gpus"].size(), 8u);
  for (const auto& g : j["gpus"]) {
    EXPECT_EQ(g["memory_mib"], 81559);
    EXPECT_EQ(g["uuid"].get<std::string>().rfind("GPU-", 0), 0u);
  }
  EXPECT_EQ(j["nvlink_matrix"][0][7], 18);
}

TEST(InfoCommand, TableOnDgxA100ShowsMigDevicesAndTopology) {
  const std::string state = TempDir();
  CommandResult r = RunCommand(Gpulet("--simulate dgx-a100 --sim-state " + state + " info"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("NVIDIA A100-SXM4-40GB"), std::string::npos);
  EXPECT_NE(r.output.find("MIG 3g.20gb"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("NV12"), std::string::npos);
  EXPECT_NE(r.output.find("Topology"), std::string::npos);
}

TEST(InfoCommand, MissingNvmlLibraryExitsTenWithOneLine) {
  CommandResult r = RunCommand(Gpulet("--nvml-library /nonexistent/libnvidia-ml.so.1 info"));
  EXPECT_EQ(r.exit_code, 10) << r.output;
  EXPECT_NE(r.output.find("gpulet: error: cannot load NVML library"), std::string::npos) << r.output;
}

TEST(InfoCommand, NvmlLibraryWithoutARequiredSymbolExitsEleven) {
  const std::string state = TempDir();
  CommandResult r = RunCommand(Gpulet("--simulate dgx-h100 --sim-state " + state +
                                      " --nvml-library " + GPULET_BUILD_DIR +
                                      "/sim/missing-symbol/libnvidia-ml.so.1 info"));
  EXPECT_EQ(r.exit_code, 11) << r.output;
  EXPECT_NE(r.output.find("nvmlDeviceGetMemoryInfo"), std::string::npos) << r.output;
}

TEST(InfoCommand, UnknownFixtureNameIsAnErrorThatListsTheKnownOnes) {
  CommandResult r = RunCommand(Gpulet("--simulate dgx-z900 --sim-state " + TempDir() + " info"));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("dgx-z900"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dgx-h100"), std::string::npos) << r.output;
}

TEST(InfoCommand, MalformedFixtureNamesFileLineAndField) {
  const std::string dir = TempDir();
  const std::string path = dir + "/bad.yaml";
  std::ofstream(path) << "driver_version: 550.54.15\ncuda_version: 12040\ngpus:\n"
                         "  - name: NVIDIA L4\n    memory_mib: lots\n";
  CommandResult r = RunCommand(Gpulet("--simulate " + path + " --sim-state " + dir + "/s info"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("bad.yaml:5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("memory_mib"), std::string::npos) << r.output;
}

TEST(InfoCommand, GpuLostDuringDiscoveryFailsWholeWithExitThirteen) {
  const std::string state = TempDir();
  const std::string sim = "--simulate dgx-h100 --sim-state " + state + " ";
  CommandResult lose = RunCommand(Gpulet(sim + "sim lose --gpu 5"));
  ASSERT_EQ(lose.exit_code, 0) << lose.output;
  CommandResult r = RunCommand(Gpulet(sim + "info --output json"));
  EXPECT_EQ(r.exit_code, 13) << r.output;
  EXPECT_NE(r.output.find("GPU 5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("NVML_ERROR_GPU_IS_LOST"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\"gpus\""), std::string::npos) << "no partial inventory on stdout";
  CommandResult restore = RunCommand(Gpulet(sim + "sim restore --gpu 5"));
  ASSERT_EQ(restore.exit_code, 0) << restore.output;
  EXPECT_EQ(RunCommand(Gpulet(sim + "info")).exit_code, 0);
}

TEST(InfoCommand, NvmlInitFailureExitsTwelve) {
  const std::string dir = TempDir();
  const std::string path = dir + "/no-driver.yaml";
  {
    std::ifstream in(std::string(GPULET_SOURCE_DIR) + "/testing/fixtures/l4-pcie.yaml");
    std::ofstream out(path);
    out << in.rdbuf() << "\ninit_error: DRIVER_NOT_LOADED\n";
  }
  CommandResult r = RunCommand(Gpulet("--simulate " + path + " --sim-state " + dir + "/s info"));
  EXPECT_EQ(r.exit_code, 12) << r.output;
  EXPECT_NE(r.output.find("DRIVER_NOT_LOADED"), std::string::npos) << r.output;
}

TEST(SimCommand, SetXidAndResetChangeTheStateAnotherProcessReads) {
  const std::string sim = "--simulate dgx-h100 --sim-state " + TempDir() + " ";
  ASSERT_EQ(RunCommand(Gpulet(sim + "sim set --gpu 1 --temperature 91")).exit_code, 0);
  ASSERT_EQ(RunCommand(Gpulet(sim + "sim xid --gpu 2 --code 79")).exit_code, 0);
  CommandResult show = RunCommand(Gpulet(sim + "sim show 2>/dev/null"));
  ASSERT_EQ(show.exit_code, 0) << show.output;
  nlohmann::json j = nlohmann::json::parse(show.output);
  EXPECT_EQ(j["gpus"][1]["temperature_c"], 91);
  ASSERT_EQ(j["control"]["events"].size(), 1u);
  ASSERT_EQ(RunCommand(Gpulet(sim + "sim reset")).exit_code, 0);
  j = nlohmann::json::parse(RunCommand(Gpulet(sim + "sim show 2>/dev/null")).output);
  EXPECT_NE(j["gpus"][1]["temperature_c"], 91) << "reset drops the override";
  EXPECT_TRUE(j["control"]["events"].empty());
}

TEST(SimCommand, UnknownGpuIsAnErrorNamingIt) {
  const std::string sim = "--simulate l4-pcie --sim-state " + TempDir() + " ";
  CommandResult r = RunCommand(Gpulet(sim + "sim xid --gpu 9 --code 79"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("9"), std::string::npos) << r.output;
}

TEST(Cli, EveryCommandHasHelp) {
  for (const char* cmd : {"", "info", "version", "sim"}) {
    CommandResult r = RunCommand(Gpulet(std::string(cmd) + " --help"));
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << cmd;
  }
}

TEST(Cli, VersionPrintsTheProjectVersion) {
  CommandResult r = RunCommand(Gpulet("version"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output.rfind("gpulet ", 0), 0u) << r.output;
}

TEST(Cli, BadLogLevelIsAUsageError) {
  CommandResult r = RunCommand(Gpulet("--log-level loud version"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

}  // namespace
}  // namespace gpulet::testing
