// The simulated driver's MIG layout rules, and their persistence in control.json.
#include "sim/mig_layout.h"

#include <gtest/gtest.h>

#include "gpu/nvml_api.h"
#include "sim/simulation.h"

namespace gpulet::sim {
namespace {

Fixture A100Fixture() {
  Result<std::string> path = ResolveFixture("dgx-a100");
  EXPECT_TRUE(path.ok());
  Result<Fixture> f = LoadFixture(*path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return *f;
}

TEST(MigLayout, FixtureProfilesCarryIdsAndPlacements) {
  Fixture f = A100Fixture();
  const MigProfile& p3 = f.mig_profiles.at("3g.20gb");
  EXPECT_EQ(p3.id, NVML_GPU_INSTANCE_PROFILE_3_SLICE);
  EXPECT_EQ(p3.placements, (std::vector<unsigned>{0, 4}));
  EXPECT_EQ(p3.placement_size, 4u);
  const MigProfile& p1 = f.mig_profiles.at("1g.10gb");
  EXPECT_EQ(p1.id, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2);
  EXPECT_EQ(p1.placements, (std::vector<unsigned>{0, 2, 4, 6}));
  EXPECT_EQ(f.mig_profiles.at("7g.40gb").placement_size, 8u);
}

TEST(MigLayout, RejectsPlacementsPastTheMemorySlices) {
  Result<Fixture> f = ParseFixture(
      "driver_version: 1\ncuda_version: 12040\nmig_profiles:\n"
      "  3g.20gb: {slices: 3, memory_mb: 19968, sms: 42, placements: [0, 6]}\n"
      "gpus:\n  - {name: X, memory_mib: 1, compute_capability: \"8.0\", architecture: ampere}\n",
      "f.yaml");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("mig_profiles.3g.20gb.placements"), std::string::npos)
      << f.status().message();
}

TEST(MigLayout, CreateFollowsPlacementsAndIds) {
  Fixture f = A100Fixture();
  const GpuSpec& gpu = f.gpus[2];
  MigLayoutState layout;
  unsigned gi = 0, ci = 0;
  EXPECT_EQ(CreateGpuInstanceInLayout(f, layout, NVML_GPU_INSTANCE_PROFILE_3_SLICE, 4, &gi),
            NVML_ERROR_INVALID_STATE);  // MIG off
  ASSERT_EQ(SetMigModeInLayout(gpu, layout, true), NVML_SUCCESS);
  EXPECT_EQ(CreateGpuInstanceInLayout(f, layout, NVML_GPU_INSTANCE_PROFILE_3_SLICE, 2, &gi),
            NVML_ERROR_INVALID_ARGUMENT);  // 3g starts at 0 or 4 only
  ASSERT_EQ(CreateGpuInstanceInLayout(f, layout, NVML_GPU_INSTANCE_PROFILE_3_SLICE, 4, &gi),
            NVML_SUCCESS);
  EXPECT_EQ(gi, 2u);
  EXPECT_EQ(CreateGpuInstanceInLayout(f, layout, NVML_GPU_INSTANCE_PROFILE_1_SLICE, 6, &gi),
            NVML_ERROR_INSUFFICIENT_RESOURCES);  // slice 6 is inside the 3g at 4..7
  ASSERT_EQ(CreateGpuInstanceInLayout(f, layout, NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, &gi),
            NVML_SUCCESS);
  EXPECT_EQ(gi, 8u);
  EXPECT_EQ(CreateGpuInstanceInLayout(f, layout, NVML_GPU_INSTANCE_PROFILE_4_SLICE, 0, &gi),
            NVML_ERROR_INSUFFICIENT_RESOURCES);
  EXPECT_EQ(CreateGpuInstanceInLayout(f, layout, NVML_GPU_INSTANCE_PROFILE_8_SLICE, 0, &gi),
            NVML_ERROR_NOT_SUPPORTED);  // not an A100 profile

  EXPECT_EQ(CreateComputeInstanceInLayout(f, layout, 2, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, &ci),
            NVML_ERROR_NOT_SUPPORTED);  // only whole-GI compute instances
  ASSERT_EQ(CreateComputeInstanceInLayout(f, layout, 2, NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, &ci),
            NVML_SUCCESS);
  EXPECT_EQ(CreateComputeInstanceInLayout(f, layout, 2, NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, &ci),
            NVML_ERROR_INSUFFICIENT_RESOURCES);

  std::vector<MigDeviceSpec> devices = MigDevicesOf(f, gpu, {}, layout);
  ASSERT_EQ(devices.size(), 1u);  // the 1g has no compute instance yet: no MIG device
  EXPECT_EQ(devices[0].profile, "3g.20gb");
  EXPECT_EQ(devices[0].uuid, DerivedMigUuid(gpu.uuid, 2, 0));

  EXPECT_EQ(DestroyGpuInstanceInLayout(layout, 2), NVML_ERROR_IN_USE);  // has a compute instance
  EXPECT_EQ(SetMigModeInLayout(gpu, layout, false), NVML_ERROR_IN_USE);
  ASSERT_EQ(DestroyComputeInstanceInLayout(layout, 2, 0), NVML_SUCCESS);
  ASSERT_EQ(DestroyGpuInstanceInLayout(layout, 2), NVML_SUCCESS);
  ASSERT_EQ(DestroyGpuInstanceInLayout(layout, 8), NVML_SUCCESS);
  EXPECT_EQ(DestroyGpuInstanceInLayout(layout, 8), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(SetMigModeInLayout(gpu, layout, false), NVML_SUCCESS);
}

TEST(MigLayout, FixtureLayoutKeepsItsUuidsAndOrder) {
  Fixture f = A100Fixture();
  const GpuSpec& gpu = f.gpus[0];
  MigLayoutState layout = LayoutFromFixture(gpu.mig);
  EXPECT_TRUE(layout.enabled);
  ASSERT_EQ(layout.instances.size(), 4u);
  EXPECT_EQ(layout.instances[0].gi, 2u);
  std::vector<MigDeviceSpec> devices = MigDevicesOf(f, gpu, gpu.mig, layout);
  ASSERT_EQ(devices.size(), gpu.mig.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    EXPECT_EQ(devices[i].uuid, gpu.mig[i].uuid);
    EXPECT_EQ(devices[i].gi, gpu.mig[i].gi);
  }
}

TEST(MigLayout, LayoutAndFaultHookRoundTripThroughControlJson) {
  ControlState s;
  MigLayoutState layout;
  layout.enabled = true;
  layout.instances.push_back({9, "1g.5gb", 2, {0}});
  s.mig[3] = layout;
  s.mig[4] = MigLayoutState{true, {}};
  s.mig_create_fail_countdown = 2;
  Result<ControlState> back = ControlStateFromJson(ControlStateToJson(s), "control.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->mig, s.mig);
  EXPECT_EQ(back->mig_create_fail_countdown, 2u);
  // A file without the new keys (written before MIG management existed) still reads.
  Result<ControlState> old =
      ControlStateFromJson(R"({"next_seq":1,"gpus":{},"events":[]})", "control.json");
  ASSERT_TRUE(old.ok());
  EXPECT_TRUE(old->mig.empty());
}

}  // namespace
}  // namespace gpulet::sim
