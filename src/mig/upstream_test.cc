// mig-parted's own files (../shared/upstream/mig-parted, not copied into this repository) load,
// and every config in config-default.yaml plans on the simulated nodes it is meant for: through
// its device-filter (the fixtures carry their GPUs' real PCI device ids), or by profiles the
// GPU model offers. A config for another GPU model fails only because its profiles are not
// offered there.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "mig/config.h"
#include "mig/driver.h"
#include "mig/plan.h"
#include "sim/sim_node.h"
#include "support/require.h"

namespace gpulet::mig {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path Upstream() {
  return fs::path(GPULET_SOURCE_DIR) / ".." / "shared" / "upstream" / "mig-parted";
}

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> ConfigNames(const std::string& text) {
  std::vector<std::string> names;
  for (const auto& kv : YAML::Load(text)["mig-configs"]) names.push_back(kv.first.Scalar());
  return names;
}

#define SKIP_WITHOUT_UPSTREAM() GPULET_REQUIRE_SHARED((Upstream() / "config-default.yaml").string())

TEST(MigPartedFiles, EveryConfigOfEveryFileLoads) {
  SKIP_WITHOUT_UPSTREAM();
  size_t configs = 0;
  for (const char* file : {"config-default.yaml", "config.yaml", "dgx-station-80gb-config.yaml"}) {
    const std::string text = Read(Upstream() / file);
    for (const std::string& name : ConfigNames(text)) {
      Result<MigConfig> c = ParseMigConfig(text, file, name);
      EXPECT_TRUE(c.ok()) << file << " " << name << ": " << c.status().message();
      if (c.ok()) {
        EXPECT_TRUE(c->warnings.empty()) << c->warnings.front();
      }
      ++configs;
    }
  }
  EXPECT_GT(configs, 60u);
}

// Configs that must plan (and change something, or nothing for all-disabled on a node without
// MIG) on each fixture, and the GPUs each of them lays out.
struct Expectation {
  const char* fixture;
  std::set<std::string> must_plan;
};

TEST(MigPartedFiles, DefaultConfigsPlanOnTheNodesTheyAreFor) {
  SKIP_WITHOUT_UPSTREAM();
  const std::string text = Read(Upstream() / "config-default.yaml");
  const std::vector<Expectation> cases = {
      {"dgx-a100",
       {"all-disabled", "all-enabled", "all-1g.5gb", "all-1g.5gb.me", "all-2g.10gb", "all-3g.20gb",
        "all-4g.20gb", "all-7g.40gb", "all-1g.10gb", "all-balanced"}},
      {"dgx-h100",
       {"all-disabled", "all-enabled", "all-1g.10gb", "all-1g.10gb.me", "all-1g.20gb",
        "all-2g.20gb", "all-3g.40gb", "all-4g.40gb", "all-7g.80gb", "all-balanced"}},
      {"hgx-h200",
       {"all-disabled", "all-enabled", "all-1g.18gb", "all-1g.18gb.me", "all-1g.35gb",
        "all-2g.35gb", "all-3g.71gb", "all-4g.71gb", "all-7g.141gb", "all-balanced"}},
  };
  for (const Expectation& want : cases) {
    Result<gpu::testing::SimNode> node = gpu::testing::OpenSimNode(want.fixture);
    ASSERT_TRUE(node.ok()) << node.status().message();
    Result<std::vector<GpuState>> state = ReadMigState(*node->nvml);
    ASSERT_TRUE(state.ok()) << state.status().message();
    std::set<std::string> planned;
    for (const std::string& name : ConfigNames(text)) {
      Result<MigConfig> c = ParseMigConfig(text, "config-default.yaml", name);
      ASSERT_TRUE(c.ok()) << c.status().message();
      Result<Plan> plan = ComputePlan(*c, *state);
      if (plan.ok()) {
        planned.insert(name);
        continue;
      }
      // Another GPU model's config: the only acceptable failure.
      EXPECT_THAT(plan.status().message(), HasSubstr("profile not offered by this GPU model"))
          << want.fixture << " " << name;
      EXPECT_FALSE(want.must_plan.count(name))
          << want.fixture << " " << name << ": " << plan.status().message();
    }
    for (const std::string& name : want.must_plan) {
      EXPECT_TRUE(planned.count(name)) << want.fixture << ": " << name << " did not plan";
    }
  }
}

// all-1g.10gb has two `devices: all` entries; the device-filter picks 7 on an H100 and 4 on an
// A100-40GB, as on hardware.
TEST(MigPartedFiles, DeviceFilterPicksTheEntryForTheGpuModel) {
  SKIP_WITHOUT_UPSTREAM();
  const std::string text = Read(Upstream() / "config-default.yaml");
  Result<MigConfig> c = ParseMigConfig(text, "config-default.yaml", "all-1g.10gb");
  ASSERT_TRUE(c.ok()) << c.status().message();
  for (auto [fixture, per_gpu] : {std::pair{"dgx-h100", 7u}, std::pair{"dgx-a100", 4u}}) {
    Result<gpu::testing::SimNode> node = gpu::testing::OpenSimNode(fixture);
    ASSERT_TRUE(node.ok()) << node.status().message();
    Result<std::vector<GpuState>> state = ReadMigState(*node->nvml);
    ASSERT_TRUE(state.ok()) << state.status().message();
    Result<Plan> plan = ComputePlan(*c, *state);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    ASSERT_EQ(plan->gpus.size(), state->size()) << fixture;
    for (const GpuPlan& g : plan->gpus) {
      EXPECT_EQ(g.keep.size() + g.create.size(), per_gpu) << fixture << " GPU " << g.index;
    }
  }
}

}  // namespace
}  // namespace gpulet::mig
