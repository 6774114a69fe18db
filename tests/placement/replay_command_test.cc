// `gpulet replay` through the real binary: a small hand-written trace end to end, the output
// files, usage errors, and (where this workspace has it) a variant of the published trace.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../cli/run_command.h"
#include "support/require.h"

namespace gpulet::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ReplayCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "gpulet-replay-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/nodes.csv") << "sn,cpu_milli,memory_mib,gpu,model\n"
                                          "a,64000,262144,2,T4\n"
                                          "b,96000,393216,8,G2\n"
                                          "cpu,32000,65536,0,\n"
                                          "c,32000,131072,4,V100M16\n";
    std::ofstream pods(dir_ + "/pods.csv");
    pods << "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n";
    for (int i = 0; i < 6; ++i) pods << "s" << i << ",4000,8192,1,300,\n";
    for (int i = 0; i < 4; ++i) pods << "w" << i << ",8000,16384,1,1000,\n";
    pods << "m0,16000,32768,4,1000,\n";
    pods << "g0,4000,8192,1,500,V100M16\n";
    pods << "c0,2000,4096,0,0,\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Replay(const std::string& args) {
    return GpuletBinary() + " replay --trace " + dir_ + "/pods.csv --nodes " + dir_ +
           "/nodes.csv --output-dir " + dir_ + "/out " + args;
  }
  std::string dir_;
};

TEST_F(ReplayCommand, SmallTraceAllOutputs) {
  CommandResult r =
      RunCommand(Replay("--protocol literal --policy fgd,bestfit --seeds 1..3 --load 120%"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("3 GPU nodes, 14 GPUs, 13 pods"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("protocol literal"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fgd"), std::string::npos);

  const std::string csv = ReadAll(dir_ + "/out/replay.csv");
  EXPECT_EQ(csv.rfind("policy,arrived_load,allocation_mean", 0), 0U) << csv;
  EXPECT_NE(csv.find("\nfgd,0.50,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\nbestfit,1.20,"), std::string::npos) << csv;

  nlohmann::json j = nlohmann::json::parse(ReadAll(dir_ + "/out/replay.json"));
  ASSERT_EQ(j["policies"].size(), 2U);
  EXPECT_EQ(j["policies"][0]["policy"], "fgd");
  EXPECT_EQ(j["policies"][0]["seeds"], (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(j["runs"].size(), 6U);
  EXPECT_DOUBLE_EQ(j["load"].get<double>(), 1.2);
  for (const auto& run : j["runs"]) {
    EXPECT_DOUBLE_EQ(run["capacity_gpus"].get<double>(), 14);
    EXPECT_GE(run["final"]["arrived_load"].get<double>(), 1.2);
    // No policy can allocate more than the capacity, or more than arrived.
    EXPECT_LE(run["final"]["allocation"].get<double>(), 1.0);
  }
  // 50 %, 55 %, ... 120 %: 15 points per policy.
  EXPECT_EQ(j["policies"][1]["points"].size(), 15U);

  const std::string svg = ReadAll(dir_ + "/out/replay.svg");
  EXPECT_EQ(svg.rfind("<svg", 0), 0U);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1))
    ++lines;
  EXPECT_EQ(lines, 2U);
}

// The default protocol is the FGD artifact's; no policy allocates more than arrived.
TEST_F(ReplayCommand, ArtifactProtocolIsTheDefault) {
  CommandResult r = RunCommand(Replay("--policy all --seeds 1..2 --load 120%"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("protocol artifact"), std::string::npos) << r.output;
  nlohmann::json j = nlohmann::json::parse(ReadAll(dir_ + "/out/replay.json"));
  ASSERT_EQ(j["policies"].size(), 7U);
  for (const auto& run : j["runs"]) {
    EXPECT_LE(run["final"]["allocation"].get<double>(), run["final"]["arrived_load"].get<double>());
  }
  r = RunCommand(Replay("--protocol exact"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--protocol"), std::string::npos) << r.output;
}

TEST_F(ReplayCommand, SameSeedSameResult) {
  ASSERT_EQ(RunCommand(Replay("--policy random --seed 9")).exit_code, 0);
  const std::string first = ReadAll(dir_ + "/out/replay.csv");
  ASSERT_EQ(RunCommand(Replay("--policy random --seed 9 --jobs 2")).exit_code, 0);
  EXPECT_EQ(ReadAll(dir_ + "/out/replay.csv"), first);
}

TEST_F(ReplayCommand, UsageErrorsNameTheFlag) {
  CommandResult r = RunCommand(Replay("--policy firstfit"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown policy 'firstfit'"), std::string::npos) << r.output;
  r = RunCommand(Replay("--seeds 9..1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--seeds"), std::string::npos) << r.output;
  r = RunCommand(Replay("--load lots"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = RunCommand(GpuletBinary() + " replay --trace-dir " + dir_ + " --trace nosuchvariant");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("openb_pod_list_nosuchvariant.csv"), std::string::npos) << r.output;
}

TEST_F(ReplayCommand, BadTraceNamesFileAndLine) {
  std::ofstream(dir_ + "/pods.csv", std::ios::app) << "bad,1000,notanumber,0,0,\n";
  CommandResult r = RunCommand(Replay("--policy random"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("pods.csv:15: memory_mib"), std::string::npos) << r.output;
}

TEST(ReplayOpenb, FiveColumnVariantByName) {
  const std::string trace_dir = std::string(GPULET_SOURCE_DIR) + "/../shared/traces/alibaba-openb";
  GPULET_REQUIRE_SHARED(trace_dir + "/openb_node_list_gpu_node.csv");
  std::string out = ::testing::TempDir() + "gpulet-replay-openb-XXXXXX";
  ASSERT_NE(mkdtemp(out.data()), nullptr);
  CommandResult r =
      RunCommand(GpuletBinary() + " replay --trace-dir " + trace_dir +
                 " --trace multigpu20 --policy gpupacking --load 60% --output-dir " + out);
  std::filesystem::remove_all(out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1213 GPU nodes, 6212 GPUs, 8324 pods"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gpulet::testing
