// `gpulet --simulate dgx-a100 mig apply|plan` in one process, `gpulet info` in another: the
// layout change lives in the shared simulated state and the next discovery sees it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/run_command.h"
#include "sim/control.h"

namespace gpulet {
namespace {

using testing::GpuletBinary;
using ::testing::HasSubstr;
using testing::RunCommand;

constexpr const char* kConfigs = R"(version: v1
mig-configs:
  all-1g.5gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
  mixed:
    - devices: [2, 3]
      mig-enabled: true
      mig-devices:
        "3g.20gb": 1
        "2g.10gb": 1
        "1g.5gb": 2
    - devices: [0]
      mig-enabled: false
  too-big:
    - devices: [5]
      mig-enabled: true
      mig-devices:
        "4g.20gb": 1
        "3g.20gb": 1
        "1g.5gb": 1
)";

class MigCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "gpulet-mig-cmd-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/mig.yaml") << kConfigs;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Gpulet(const std::string& args) const {
    return GpuletBinary() + " --simulate dgx-a100 --sim-state " + dir_ + "/state " + args;
  }
  testing::CommandResult Mig(const std::string& verb, const std::string& config,
                             const std::string& extra = "") const {
    return RunCommand(
        Gpulet("mig " + verb + " -f " + dir_ + "/mig.yaml -c " + config + " " + extra));
  }
  nlohmann::json Info() const {
    testing::CommandResult r = RunCommand(Gpulet("info --output json") + " 2>/dev/null");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output, nullptr, false);
  }
  static std::vector<std::string> Profiles(const nlohmann::json& gpu) {
    std::vector<std::string> out;
    for (const auto& m : gpu["mig_devices"]) out.push_back(m["profile"]);
    return out;
  }

  std::string dir_;
};

TEST_F(MigCommandTest, ApplyCreatesDevicesThatAnotherProcessDiscovers) {
  nlohmann::json before = Info();
  ASSERT_FALSE(before["gpus"][2]["mig_enabled"].get<bool>());

  testing::CommandResult r = Mig("apply", "mixed");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("GPU 2 (NVIDIA A100-SXM4-40GB): MIG enabled"));

  nlohmann::json after = Info();
  for (int gpu : {2, 3}) {
    EXPECT_TRUE(after["gpus"][gpu]["mig_enabled"].get<bool>());
    EXPECT_THAT(Profiles(after["gpus"][gpu]),
                ::testing::UnorderedElementsAre("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"));
    for (const auto& m : after["gpus"][gpu]["mig_devices"]) {
      EXPECT_THAT(m["uuid"].get<std::string>(), ::testing::StartsWith("MIG-"));
      EXPECT_FALSE(m["gi_cap_path"].get<std::string>().empty());
    }
  }
  EXPECT_FALSE(after["gpus"][0]["mig_enabled"].get<bool>());  // disabled, its devices gone
  EXPECT_TRUE(after["gpus"][0]["mig_devices"].empty());
  EXPECT_EQ(Profiles(after["gpus"][1]), Profiles(before["gpus"][1]));  // not named: untouched

  // Second apply: nothing to do, same devices.
  r = Mig("apply", "mixed");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("nothing to change"));
  EXPECT_EQ(Info()["gpus"][2]["mig_devices"], after["gpus"][2]["mig_devices"]);
}

TEST_F(MigCommandTest, PlanPrintsTheChangesWithoutMakingThem) {
  testing::CommandResult r = Mig("plan", "all-1g.5gb", "--output json 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json plan = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(plan.is_discarded()) << r.output;
  EXPECT_TRUE(plan["changes"].get<bool>());
  ASSERT_EQ(plan["gpus"].size(), 8u);
  EXPECT_EQ(plan["gpus"][1]["changes"], false);      // GPU 1 already has 7 x 1g.5gb
  EXPECT_EQ(plan["gpus"][0]["destroy"].size(), 2u);  // the two 1g.5gb at 2 and 3 stay
  EXPECT_EQ(plan["gpus"][0]["create"].size(), 5u);
  EXPECT_EQ(plan["gpus"][4]["mig_enabled_after"], true);

  r = Mig("plan", "all-1g.5gb");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("GPU 4 (NVIDIA A100-SXM4-40GB): enable MIG; keep 0, destroy 0, create 7"));
  EXPECT_FALSE(Info()["gpus"][4]["mig_enabled"].get<bool>());
}

TEST_F(MigCommandTest, AnImpossibleGeometryIsRejectedBeforeAnythingChanges) {
  nlohmann::json before = Info();
  testing::CommandResult r = Mig("apply", "too-big");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("mig.yaml:20: mig-configs.too-big[0].mig-devices: GPU 5"));
  EXPECT_THAT(r.output, HasSubstr("needs 8 compute slices"));
  EXPECT_EQ(Info(), before);
  r = Mig("apply", "no-such-config");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_THAT(r.output, HasSubstr("all-1g.5gb, mixed, too-big"));
}

TEST_F(MigCommandTest, AFailedCreateIsRolledBackAndARerunConverges) {
  nlohmann::json before = Info();
  // Prepare the state dir (first Info did), then make the 4th instance create fail.
  sim::ControlFile control(dir_ + "/state");
  ASSERT_TRUE(control.Update([](sim::ControlState& s) { s.mig_create_fail_countdown = 4; }).ok());
  testing::CommandResult r = Mig("apply", "mixed");
  EXPECT_EQ(r.exit_code, 14) << r.output;
  EXPECT_THAT(r.output, HasSubstr("GPU 2 (NVIDIA A100-SXM4-40GB): creating"));
  EXPECT_THAT(r.output, HasSubstr("NVML_ERROR_INSUFFICIENT_RESOURCES"));
  EXPECT_THAT(r.output, HasSubstr("rolled back"));
  nlohmann::json after = Info();
  EXPECT_EQ(after["gpus"][2], before["gpus"][2]);  // MIG off again, no devices
  EXPECT_EQ(after["gpus"][3], before["gpus"][3]);  // never reached
  // GPU 0 comes before GPU 2 and was applied (MIG disabled).
  EXPECT_FALSE(after["gpus"][0]["mig_enabled"].get<bool>());

  r = Mig("apply", "mixed");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(Profiles(Info()["gpus"][3]), ::testing::SizeIs(4));
}

TEST_F(MigCommandTest, HelpDescribesBothVerbs) {
  testing::CommandResult r = RunCommand(GpuletBinary() + " mig apply --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--file"));
  EXPECT_THAT(r.output, HasSubstr("--config"));
}

}  // namespace
}  // namespace gpulet
