// GFD's end-to-end expected labels (../shared/upstream/gpu-feature-discovery, regular expressions,
// one a line; each must match the start of some label line) against gpulet's labels for
// simulated nodes: no MIG (l4-pcie), mig-strategy=single and mig-strategy=mixed (dgx-a100).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "gpu/inventory.h"
#include "labels/labels.h"
#include "sharing/plan.h"
#include "sim/sim_node.h"
#include "support/require.h"

namespace gpulet::labels {
namespace {

namespace fs = std::filesystem;

fs::path Upstream() {
  return fs::path(GPULET_SOURCE_DIR) / ".." / "shared" / "upstream" / "gpu-feature-discovery";
}

std::vector<std::string> Patterns(const std::string& file) {
  std::ifstream in(Upstream() / file);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

gpu::Inventory Discover(const std::string& fixture) {
  Result<gpu::testing::SimNode> node = gpu::testing::OpenSimNode(fixture);
  EXPECT_TRUE(node.ok()) << node.status().message();
  if (!node.ok()) return {};
  Result<gpu::Inventory> inv = gpu::Discover(*node->nvml, node->options);
  EXPECT_TRUE(inv.ok()) << inv.status().message();
  return inv.ok() ? *inv : gpu::Inventory{};
}

void ExpectAllPatternsMatch(const std::string& file, const Labels& labels) {
  const std::vector<std::string> patterns = Patterns(file);
  ASSERT_GT(patterns.size(), 20u) << file;
  std::vector<std::string> lines;
  for (const auto& [k, v] : labels) lines.push_back(k + "=" + v);
  for (const std::string& p : patterns) {
    const std::regex re(p, std::regex::ECMAScript);
    bool found = false;
    for (const std::string& line : lines) {
      found = found || std::regex_search(line, re, std::regex_constants::match_continuous);
    }
    EXPECT_TRUE(found) << file << ": no label matches " << p << "\n" << FeatureFile(labels);
  }
}

LabelOptions Options(config::MigStrategy strategy) {
  LabelOptions o;
  o.mig_strategy = strategy;
  o.timestamp = 1764756000;
  return o;
}

#define SKIP_WITHOUT_UPSTREAM() GPULET_REQUIRE_SHARED((Upstream() / "expected-output.txt").string())

TEST(GfdExpectedOutput, NoMig) {
  SKIP_WITHOUT_UPSTREAM();
  const gpu::Inventory inv = Discover("l4-pcie");
  Result<sharing::Plan> plan = sharing::BuildPlan(inv, config::Config{});
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const Labels l = NodeLabels(inv, *plan, Options(config::MigStrategy::kNone));
  ExpectAllPatternsMatch("expected-output.txt", l);
  EXPECT_EQ(l.at("nvidia.com/gpu.family"), "ada-lovelace");
  EXPECT_EQ(l.at("nvidia.com/gpu.mode"), "compute");
  EXPECT_EQ(l.count("nvidia.com/mig.strategy"), 0u);
}

TEST(GfdExpectedOutput, MigMixed) {
  SKIP_WITHOUT_UPSTREAM();
  const gpu::Inventory inv = Discover("dgx-a100");
  ASSERT_GT(inv.MigDeviceCount(), 0u);
  config::Config cfg;
  cfg.flags.mig_strategy = config::MigStrategy::kMixed;
  Result<sharing::Plan> plan = sharing::BuildPlan(inv, cfg);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ExpectAllPatternsMatch("expected-output-mig-mixed.txt",
                         NodeLabels(inv, *plan, Options(config::MigStrategy::kMixed)));
}

TEST(GfdExpectedOutput, MigSingle) {
  SKIP_WITHOUT_UPSTREAM();
  // One profile on every GPU: the dgx-a100 fixture's first MIG GPU, alone.
  gpu::Inventory inv = Discover("dgx-a100");
  std::erase_if(inv.gpus, [](const gpu::Gpu& g) { return !g.mig_enabled; });
  ASSERT_FALSE(inv.gpus.empty());
  inv.gpus.resize(1);
  auto& migs = inv.gpus[0].mig_devices;
  std::erase_if(migs, [&](const gpu::MigDevice& m) { return m.profile != migs.front().profile; });
  const Labels l = NodeLabels(inv, sharing::Plan{}, Options(config::MigStrategy::kSingle));
  ExpectAllPatternsMatch("expected-output-mig-single.txt", l);
  EXPECT_NE(l.at("nvidia.com/gpu.product").find("-MIG-"), std::string::npos);
  EXPECT_EQ(l.at("nvidia.com/mig.strategy"), "single");
}

}  // namespace
}  // namespace gpulet::labels
