// ReadMigState / ApplyPlan against the simulated driver, loaded through the real dlopen path.
#include "mig/driver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpu/inventory.h"
#include "sim/control.h"
#include "sim/sim_node.h"

namespace gpulet::mig {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Profiles(const gpu::Gpu& g) {
  std::vector<std::string> out;
  for (const auto& m : g.mig_devices) out.push_back(m.profile);
  return out;
}

class MigDriverTest : public ::testing::Test {
 protected:
  void Open(const std::string& fixture) {
    Result<gpu::testing::SimNode> node = gpu::testing::OpenSimNode(fixture);
    ASSERT_TRUE(node.ok()) << node.status().message();
    node_ = std::move(node).value();
  }

  gpu::Inventory Discover() {
    Result<gpu::Inventory> inv = gpu::Discover(*node_.nvml, node_.options);
    EXPECT_TRUE(inv.ok()) << inv.status().message();
    return inv.ok() ? *inv : gpu::Inventory{};
  }

  Plan PlanFor(const std::string& yaml) {
    Result<MigConfig> config = ParseMigConfig(yaml, "test.yaml", "c");
    EXPECT_TRUE(config.ok()) << config.status().message();
    Result<std::vector<GpuState>> state = ReadMigState(*node_.nvml);
    EXPECT_TRUE(state.ok()) << state.status().message();
    Result<Plan> plan = ComputePlan(*config, *state);
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    return plan.ok() ? *plan : Plan{};
  }

  gpu::testing::SimNode node_;
};

TEST_F(MigDriverTest, ReadsProfilesPlacementsAndInstances) {
  Open("dgx-a100");
  Result<std::vector<GpuState>> state = ReadMigState(*node_.nvml);
  ASSERT_TRUE(state.ok()) << state.status().message();
  ASSERT_EQ(state->size(), 8u);
  const GpuState& g0 = (*state)[0];
  EXPECT_TRUE(g0.mig_enabled);
  ASSERT_EQ(g0.instances.size(), 4u);
  EXPECT_EQ(g0.instances[0].profile, "2g.10gb");
  EXPECT_EQ(g0.instances[0].start, 0u);
  EXPECT_EQ(*g0.instances[0].gi, 3u);
  EXPECT_EQ(g0.instances[3].profile, "3g.20gb");
  EXPECT_EQ(g0.instances[3].start, 4u);
  bool saw_3g = false;
  for (const auto& p : g0.profiles) {
    if (p.name == "3g.20gb") {
      saw_3g = true;
      EXPECT_EQ(p.starts, (std::vector<unsigned>{0, 4}));
      EXPECT_EQ(p.size, 4u);
    }
  }
  EXPECT_TRUE(saw_3g);
  EXPECT_FALSE((*state)[2].mig_enabled);
  EXPECT_TRUE((*state)[2].instances.empty());
}

TEST_F(MigDriverTest, AppliesAConfigAndDiscoverySeesTheNewDevices) {
  Open("dgx-h100");
  Plan plan = PlanFor(
      "version: v1\nmig-configs:\n  c:\n    - devices: [0, 3]\n      mig-enabled: true\n"
      "      mig-devices: {\"3g.40gb\": 1, \"2g.20gb\": 1, \"1g.10gb\": 2}\n"
      "    - devices: [1]\n      mig-enabled: true\n      mig-devices: {}\n");
  ASSERT_TRUE(plan.changes());
  std::vector<std::string> steps;
  Status st = ApplyPlan(*node_.nvml, plan, [&](const std::string& s) { steps.push_back(s); });
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_FALSE(steps.empty());

  gpu::Inventory inv = Discover();
  ASSERT_EQ(inv.gpus.size(), 8u);
  EXPECT_TRUE(inv.gpus[0].mig_enabled);
  EXPECT_THAT(Profiles(inv.gpus[0]),
              ::testing::UnorderedElementsAre("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"));
  EXPECT_THAT(Profiles(inv.gpus[3]), ::testing::SizeIs(4));
  EXPECT_TRUE(inv.gpus[1].mig_enabled);  // enabled with no devices
  EXPECT_TRUE(inv.gpus[1].mig_devices.empty());
  EXPECT_FALSE(inv.gpus[2].mig_enabled);
  for (const auto& m : inv.gpus[0].mig_devices) {
    EXPECT_FALSE(m.gi_cap_path.empty()) << m.profile;  // capability nodes for new instances
    EXPECT_FALSE(m.ci_cap_path.empty()) << m.profile;
  }

  // Idempotent: the same config again plans and changes nothing.
  Plan again = PlanFor(
      "version: v1\nmig-configs:\n  c:\n    - devices: [0, 3]\n      mig-enabled: true\n"
      "      mig-devices: {\"3g.40gb\": 1, \"2g.20gb\": 1, \"1g.10gb\": 2}\n"
      "    - devices: [1]\n      mig-enabled: true\n      mig-devices: {}\n");
  EXPECT_FALSE(again.changes()) << PlanToText(again);
  std::vector<std::string> uuids;
  for (const auto& m : inv.gpus[0].mig_devices) uuids.push_back(m.uuid);
  ASSERT_TRUE(ApplyPlan(*node_.nvml, again).ok());
  std::vector<std::string> uuids_after;
  const gpu::Inventory after = Discover();
  for (const auto& m : after.gpus[0].mig_devices) uuids_after.push_back(m.uuid);
  EXPECT_EQ(uuids, uuids_after);
}

TEST_F(MigDriverTest, ReshapesAndDisables) {
  Open("dgx-a100");
  Plan plan = PlanFor(
      "version: v1\nmig-configs:\n  c:\n    - devices: [0]\n      mig-enabled: true\n"
      "      mig-devices: {\"7g.40gb\": 1}\n    - devices: [1]\n      mig-enabled: false\n");
  ASSERT_TRUE(ApplyPlan(*node_.nvml, plan).ok());
  gpu::Inventory inv = Discover();
  EXPECT_THAT(Profiles(inv.gpus[0]), ::testing::ElementsAre("7g.40gb"));
  EXPECT_EQ(inv.gpus[0].mig_devices[0].gpu_instance_id, 0u);
  EXPECT_FALSE(inv.gpus[1].mig_enabled);
  EXPECT_TRUE(inv.gpus[1].mig_devices.empty());
}

TEST_F(MigDriverTest, AFailedCreateRollsTheGpuBackToItsPreviousLayout) {
  Open("dgx-a100");
  gpu::Inventory before = Discover();
  Plan plan = PlanFor(
      "version: v1\nmig-configs:\n  c:\n    - devices: [0]\n      mig-enabled: true\n"
      "      mig-devices: {\"1g.5gb\": 7}\n");
  // The third create (GI, CI, GI…) fails: one 1g device is half made when it does.
  sim::ControlFile control(node_.node.state_dir);
  ASSERT_TRUE(control.Update([](sim::ControlState& s) { s.mig_create_fail_countdown = 3; }).ok());
  Status st = ApplyPlan(*node_.nvml, plan);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kNvmlError);
  EXPECT_THAT(st.message(), HasSubstr("GPU 0 (NVIDIA A100-SXM4-40GB): creating 1g.5gb"));
  EXPECT_THAT(st.message(), HasSubstr("Insufficient resources"));
  EXPECT_THAT(st.message(), HasSubstr("rolled back to its previous MIG layout"));

  gpu::Inventory after = Discover();
  ASSERT_EQ(after.gpus[0].mig_devices.size(), before.gpus[0].mig_devices.size());
  for (size_t i = 0; i < before.gpus[0].mig_devices.size(); ++i) {
    EXPECT_EQ(after.gpus[0].mig_devices[i].profile, before.gpus[0].mig_devices[i].profile);
    EXPECT_EQ(after.gpus[0].mig_devices[i].gpu_instance_id,
              before.gpus[0].mig_devices[i].gpu_instance_id);
    EXPECT_EQ(after.gpus[0].mig_devices[i].uuid, before.gpus[0].mig_devices[i].uuid);
  }
  // With the fault gone, the same apply converges.
  ASSERT_TRUE(ApplyPlan(*node_.nvml, PlanFor("version: v1\nmig-configs:\n  c:\n    - devices: [0]\n"
                                             "      mig-enabled: true\n"
                                             "      mig-devices: {\"1g.5gb\": 7}\n"))
                  .ok());
  EXPECT_THAT(Profiles(Discover().gpus[0]), ::testing::SizeIs(7));
}

// mig-parted's "+me" device names are the REV1 profiles; applying twice changes nothing the
// second time. (A compute-instance profile such as "1c.3g.40gb" plans like its GPU instance, see
// plan_test; the simulated driver creates whole compute instances only.)
TEST_F(MigDriverTest, AppliesMediaExtensionProfiles) {
  Open("dgx-h100");
  const std::string yaml =
      "version: v1\nmig-configs:\n  c:\n    - devices: [2]\n      mig-enabled: true\n"
      "      mig-devices: {\"3g.40gb\": 1, \"1g.10gb+me\": 1}\n";
  Plan plan = PlanFor(yaml);
  ASSERT_EQ(plan.gpus.size(), 1u);
  EXPECT_EQ(plan.gpus[0].create.size(), 2u);
  Status st = ApplyPlan(*node_.nvml, plan, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  Result<std::vector<GpuState>> state = ReadMigState(*node_.nvml);
  ASSERT_TRUE(state.ok()) << state.status().message();
  std::vector<std::string> names;
  for (const GpuInstance& i : (*state)[2].instances) names.push_back(i.profile);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("3g.40gb", "1g.10gb+me"));
  EXPECT_FALSE(PlanFor(yaml).changes());
}

TEST_F(MigDriverTest, AFailureAfterEnablingMigTurnsItOffAgain) {
  Open("dgx-a100");
  Plan plan = PlanFor(
      "version: v1\nmig-configs:\n  c:\n    - devices: [4]\n      mig-enabled: true\n"
      "      mig-devices: {\"3g.20gb\": 2}\n");
  sim::ControlFile control(node_.node.state_dir);
  ASSERT_TRUE(control.Update([](sim::ControlState& s) { s.mig_create_fail_countdown = 1; }).ok());
  Status st = ApplyPlan(*node_.nvml, plan);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("GPU 4"));
  gpu::Inventory inv = Discover();
  EXPECT_FALSE(inv.gpus[4].mig_enabled);
}

}  // namespace
}  // namespace gpulet::mig
