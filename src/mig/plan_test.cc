#include "mig/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpulet::mig {
namespace {

using ::testing::HasSubstr;

// The A100-40GB and H100-80GB profile tables (starts in memory slices).
std::vector<ProfileSpec> A100() {
  return {{"1g.5gb", 0, 1, 4864, {0, 1, 2, 3, 4, 5, 6}, 1},
          {"1g.10gb", 9, 1, 9856, {0, 2, 4, 6}, 2},
          {"2g.10gb", 1, 2, 9856, {0, 2, 4}, 2},
          {"3g.20gb", 2, 3, 19968, {0, 4}, 4},
          {"4g.20gb", 3, 4, 19968, {0}, 4},
          {"7g.40gb", 4, 7, 40192, {0}, 8}};
}
std::vector<ProfileSpec> H100() {
  return {{"1g.10gb", 0, 1, 9984, {0, 1, 2, 3, 4, 5, 6}, 1},
          {"1g.20gb", 9, 1, 19968, {0, 2, 4, 6}, 2},
          {"2g.20gb", 1, 2, 19968, {0, 2, 4}, 2},
          {"3g.40gb", 2, 3, 40192, {0, 4}, 4},
          {"4g.40gb", 3, 4, 40192, {0}, 4},
          {"7g.80gb", 4, 7, 81152, {0}, 8}};
}

std::vector<unsigned> Starts(const std::vector<GpuInstance>& list, const std::string& profile) {
  std::vector<unsigned> out;
  for (const auto& i : list) {
    if (i.profile == profile) out.push_back(i.start);
  }
  return out;
}

struct Geometry {
  const char* model;
  std::vector<std::pair<std::string, unsigned>> want;
  const char* error;  // nullptr: must fit
};

class GeometryTest : public ::testing::TestWithParam<Geometry> {};

TEST_P(GeometryTest, FitsOrSaysWhy) {
  const Geometry& g = GetParam();
  auto profiles = std::string(g.model) == "a100" ? A100() : H100();
  Result<std::vector<GpuInstance>> placed = PlaceInstances(profiles, {}, g.want);
  if (g.error == nullptr) {
    ASSERT_TRUE(placed.ok()) << placed.status().message();
    // Valid starts, no overlap.
    unsigned used = 0, count = 0;
    for (const auto& i : *placed) {
      const ProfileSpec* p = nullptr;
      for (const auto& q : profiles) {
        if (q.name == i.profile) p = &q;
      }
      ASSERT_NE(p, nullptr);
      EXPECT_NE(std::find(p->starts.begin(), p->starts.end(), i.start), p->starts.end());
      const unsigned mask = ((1u << p->size) - 1) << i.start;
      EXPECT_EQ(used & mask, 0u) << i.profile << "@" << i.start;
      used |= mask;
      ++count;
    }
    unsigned want = 0;
    for (const auto& [_, n] : g.want) want += n;
    EXPECT_EQ(count, want);
  } else {
    ASSERT_FALSE(placed.ok());
    EXPECT_THAT(placed.status().message(), HasSubstr(g.error));
  }
}

INSTANTIATE_TEST_SUITE_P(
    A100AndH100, GeometryTest,
    ::testing::Values(Geometry{"a100", {{"1g.5gb", 7}}, nullptr},
                      Geometry{"a100", {{"3g.20gb", 2}}, nullptr},
                      Geometry{"a100", {{"4g.20gb", 1}, {"3g.20gb", 1}}, nullptr},
                      Geometry{"a100", {{"3g.20gb", 1}, {"2g.10gb", 1}, {"1g.5gb", 2}}, nullptr},
                      Geometry{"a100", {{"2g.10gb", 3}, {"1g.5gb", 1}}, nullptr},
                      Geometry{"a100", {{"7g.40gb", 1}}, nullptr},
                      Geometry{"a100", {{"1g.10gb", 4}}, nullptr},
                      Geometry{"a100", {{"1g.5gb", 8}}, "at most 7 fit"},
                      Geometry{"a100", {{"3g.20gb", 3}}, "at most 2 fit"},
                      Geometry{"a100", {{"4g.20gb", 2}}, "at most 1 fit"},
                      Geometry{"a100", {{"7g.40gb", 1}, {"1g.5gb", 1}}, "needs 8 compute slices"},
                      Geometry{"a100", {{"4g.20gb", 1}, {"2g.10gb", 2}}, "needs 8 compute slices"},
                      // 3 + 3 + 1 slices = 7, but the two 3g take all 8 memory slices.
                      Geometry{"a100", {{"3g.20gb", 2}, {"1g.5gb", 1}}, "needs 9 memory slices"},
                      Geometry{"a100", {{"6g.30gb", 1}}, "profile not offered"},
                      Geometry{"h100", {{"1g.10gb", 7}}, nullptr},
                      Geometry{"h100", {{"3g.40gb", 1}, {"2g.20gb", 1}, {"1g.20gb", 1}}, nullptr},
                      Geometry{"h100", {{"1g.20gb", 4}}, nullptr},
                      Geometry{"h100", {{"1g.20gb", 4}, {"1g.10gb", 1}}, "needs 9 memory slices"},
                      Geometry{"h100", {{"1g.5gb", 1}}, "profile not offered"}));

TEST(PlaceInstances, RespectsFixedInstancesAndNamesTheProfileThatCannotBePlaced) {
  // A 1g at slice 5 blocks the 3g start at 4 and 2g starts 4; 3g can still go at 0.
  std::vector<GpuInstance> fixed = {{"1g.5gb", 5, 9, true}};
  Result<std::vector<GpuInstance>> placed = PlaceInstances(A100(), fixed, {{"3g.20gb", 1}});
  ASSERT_TRUE(placed.ok()) << placed.status().message();
  EXPECT_EQ(Starts(*placed, "3g.20gb"), (std::vector<unsigned>{0}));
  // A 1g at slice 1 and one at 5 leave no 3g start: 3g needs 0-3 or 4-7.
  fixed.push_back({"1g.5gb", 1, 8, true});
  placed = PlaceInstances(A100(), fixed, {{"3g.20gb", 1}});
  ASSERT_FALSE(placed.ok());
  EXPECT_THAT(placed.status().message(), HasSubstr("3g.20gb: no valid placement left"));
  EXPECT_THAT(placed.status().message(), HasSubstr("start only at 0,4"));
}

GpuState A100Gpu(unsigned index, bool mig, std::vector<GpuInstance> instances) {
  GpuState g;
  g.index = index;
  g.name = "NVIDIA A100-SXM4-40GB";
  g.mig_capable = true;
  g.mig_enabled = mig;
  g.profiles = A100();
  g.instances = std::move(instances);
  return g;
}

MigConfig Config(std::vector<MigConfigEntry> entries) {
  MigConfig c{"mig.yaml", "test", std::move(entries)};
  for (size_t i = 0; i < c.entries.size(); ++i) {
    c.entries[i].line = static_cast<int>(4 + i * 3);
    c.entries[i].mig_devices_line = c.entries[i].line + 2;
    c.entries[i].field = "mig-configs.test[" + std::to_string(i) + "]";
  }
  return c;
}

TEST(ComputePlan, KeepsMatchingInstancesAndCreatesTheRest) {
  // GPU 0 as in dgx-a100: 3g@4, 2g@0, 1g@2, 1g@3. Want 3g + 2g + 2g: the 3g and one 2g stay.
  std::vector<GpuState> gpus = {A100Gpu(0, true,
                                        {{"2g.10gb", 0, 3, true},
                                         {"1g.5gb", 2, 9, true},
                                         {"1g.5gb", 3, 10, true},
                                         {"3g.20gb", 4, 2, true}})};
  Result<Plan> plan = ComputePlan(
      Config({{std::vector<unsigned>{0}, true, {{"3g.20gb", 1}, {"2g.10gb", 2}}, 0, 0, ""}}), gpus);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->gpus.size(), 1u);
  const GpuPlan& g = plan->gpus[0];
  EXPECT_EQ(g.keep.size(), 2u);
  EXPECT_EQ(Starts(g.destroy, "1g.5gb"), (std::vector<unsigned>{2, 3}));
  EXPECT_EQ(Starts(g.create, "2g.10gb"), (std::vector<unsigned>{2}));
  EXPECT_TRUE(plan->changes());
}

TEST(ComputePlan, SameLayoutTwiceChangesNothing) {
  std::vector<GpuState> gpus = {
      A100Gpu(0, true, {{"3g.20gb", 0, 1, true}, {"3g.20gb", 4, 2, true}})};
  Result<Plan> plan = ComputePlan(Config({{std::nullopt, true, {{"3g.20gb", 2}}, 0, 0, ""}}), gpus);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->changes());
  EXPECT_THAT(PlanToText(*plan), HasSubstr("nothing to change"));
}

TEST(ComputePlan, RelaysOutWhenKeptInstancesBlockTheGeometry) {
  // 1g@1 and 1g@5 exist; want 3g x2 … impossible with them kept, fine from scratch.
  std::vector<GpuState> gpus = {
      A100Gpu(0, true, {{"1g.5gb", 1, 8, true}, {"1g.5gb", 5, 12, true}})};
  Result<Plan> plan =
      ComputePlan(Config({{std::nullopt, true, {{"3g.20gb", 1}, {"1g.5gb", 2}}, 0, 0, ""}}), gpus);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->gpus[0].destroy.size(), 2u);
  EXPECT_EQ(plan->gpus[0].create.size(), 3u);
}

TEST(ComputePlan, EnablesAndDisablesMig) {
  std::vector<GpuState> gpus = {A100Gpu(0, false, {}), A100Gpu(1, true, {{"7g.40gb", 0, 0, true}})};
  Result<Plan> plan = ComputePlan(Config({{std::vector<unsigned>{0}, true, {}, 0, 0, ""},
                                          {std::vector<unsigned>{1}, false, {}, 0, 0, ""}}),
                                  gpus);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_TRUE(plan->gpus[0].mig_after);
  EXPECT_FALSE(plan->gpus[0].mig_before);
  EXPECT_TRUE(plan->gpus[0].create.empty());
  EXPECT_FALSE(plan->gpus[1].mig_after);
  EXPECT_EQ(plan->gpus[1].destroy.size(), 1u);
  const auto j = PlanToJson(*plan);
  EXPECT_EQ(j["gpus"][1]["destroy"][0]["profile"], "7g.40gb");
  EXPECT_EQ(j["gpus"][0]["mig_enabled_after"], true);
}

TEST(ComputePlan, ErrorsNameTheFileLineGpuAndProfile) {
  std::vector<GpuState> gpus = {A100Gpu(0, false, {}), A100Gpu(1, false, {})};
  Result<Plan> plan =
      ComputePlan(Config({{std::vector<unsigned>{1}, true, {{"3g.20gb", 3}}, 0, 0, ""}}), gpus);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(),
            "mig.yaml:6: mig-configs.test[0].mig-devices: GPU 1 (NVIDIA A100-SXM4-40GB): "
            "3g.20gb x3: at most 2 fit (starts 0,4)");
  plan = ComputePlan(Config({{std::vector<unsigned>{5}, true, {}, 0, 0, ""}}), gpus);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("devices: GPU 5 does not exist (2 GPUs)"));
  GpuState plain;
  plain.index = 0;
  plain.name = "NVIDIA L4";
  plan = ComputePlan(Config({{std::nullopt, true, {}, 0, 0, ""}}), {plain});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("GPU 0 (NVIDIA L4) does not support MIG"));
  // Disabling MIG on a GPU without it is nothing to do, not an error.
  plan = ComputePlan(Config({{std::nullopt, false, {}, 0, 0, ""}}), {plain});
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->changes());
}

// "1c.3g.20gb" is placed as a 3g.20gb GPU instance and keeps its name.
TEST(PlaceInstances, ComputeInstanceProfilesPlaceAsTheirGpuInstance) {
  const std::vector<ProfileSpec> a100 = {{"1g.5gb", 0, 1, 4864, {0, 1, 2, 3, 4, 5, 6}, 1},
                                         {"3g.20gb", 2, 3, 19968, {0, 4}, 4}};
  Result<std::vector<GpuInstance>> placed =
      PlaceInstances(a100, {}, {{"1c.3g.20gb", 1}, {"2c.3g.20gb", 1}});
  ASSERT_TRUE(placed.ok()) << placed.status().message();
  ASSERT_EQ(placed->size(), 2u);
  EXPECT_EQ((*placed)[0].profile, "1c.3g.20gb");
  EXPECT_EQ((*placed)[1].profile, "2c.3g.20gb");
  EXPECT_FALSE(PlaceInstances(a100, {}, {{"4c.3g.20gb", 1}}).ok());
  EXPECT_FALSE(PlaceInstances(a100, {}, {{"1c.3g.20gb", 3}}).ok());
}

}  // namespace
}  // namespace gpulet::mig
