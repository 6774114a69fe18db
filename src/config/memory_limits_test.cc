#include "config/memory_limits.h"

#include <gtest/gtest.h>

namespace gpulet::config {
namespace {

TEST(MemoryLimitsConfig, AbsentMeansNoLimits) {
  auto r = ParseMemoryLimits(
      "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}\n", "c.yaml");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

TEST(MemoryLimitsConfig, ParsesAutoAndSizesWithDefaults) {
  const char* text = R"(version: v1
sharing:
  timeSlicing:
    resources:
      - {name: gpu, rename: gpu.small, replicas: 4}
gpulet:
  memoryLimits:
    resources:
      - name: gpu
)";
  auto r = ParseMemoryLimits(text, "c.yaml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(r->has_value());
  const MemoryLimits& m = **r;
  ASSERT_EQ(m.resources.size(), 1u);
  EXPECT_EQ(m.resources[0].name, "nvidia.com/gpu");
  EXPECT_FALSE(m.resources[0].per_replica.has_value());
  EXPECT_EQ(m.resources[0].where.line, 9);
  EXPECT_EQ(m.library, "/usr/lib/gpulet/libgpulet-cuda.so");
  EXPECT_EQ(m.state_dir, "/run/gpulet/memory");
  // Found by its advertised (renamed) name too.
  auto cfg = ParseConfig(text, "c.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  EXPECT_TRUE(cfg->warnings.empty()) << cfg->warnings.front();  // `gpulet` is a known key
  EXPECT_EQ(m.Find(*cfg, "nvidia.com/gpu.small"), &m.resources[0]);
  EXPECT_EQ(m.Find(*cfg, "nvidia.com/none"), nullptr);
  auto sized = ParseMemoryLimits(
      "gpulet:\n  memoryLimits:\n    resources: [{name: other, perReplica: 16Gi}]\n", "c.yaml");
  ASSERT_TRUE(sized.ok()) << sized.status().message();
  EXPECT_EQ((*sized)->resources[0].per_replica, 16ULL << 30);
}

// Issue 23 item 6: pass-through is the node's decision, a key of the config (written into the
// read-only limits file by the plugin), never the container's environment.
TEST(MemoryLimitsConfig, PassThroughIsAKeyOfTheNodesConfig) {
  auto on = ParseMemoryLimits(
      "gpulet:\n  memoryLimits:\n    resources: [{name: gpu, passThrough: true}]\n", "c.yaml");
  ASSERT_TRUE(on.ok()) << on.status().message();
  EXPECT_TRUE((*on)->resources[0].pass_through);
  auto off = ParseMemoryLimits("gpulet:\n  memoryLimits:\n    resources: [{name: gpu}]\n",
                               "c.yaml");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE((*off)->resources[0].pass_through);
  auto bad = ParseMemoryLimits(
      "gpulet:\n  memoryLimits:\n    resources:\n      - name: gpu\n        passThrough: maybe\n",
      "c.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "c.yaml:5: gpulet.memoryLimits.resources[0].passThrough: must be true or false");
}

// Issue 24 item 7: what cannot work is refused, with the reason.
TEST(MemoryLimitsConfig, RefusesWhatCannotWork) {
  // Two limited resources: a container given both would get two mounts at the same paths.
  auto r = ParseMemoryLimits(
      "gpulet:\n  memoryLimits:\n    resources:\n      - name: gpu\n      - name: gpu.small\n",
      "c.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "c.yaml:5: gpulet.memoryLimits.resources[1]: nvidia.com/gpu.small: only one resource "
            "may have memory limits (nvidia.com/gpu at c.yaml:4: gpulet.memoryLimits.resources[0]):"
            " a container given both would get two accounting directories mounted at "
            "/run/gpulet/cuda and two /etc/ld.so.preload");
  // A MIG resource, by name or under migStrategy single.
  r = ParseMemoryLimits("gpulet:\n  memoryLimits:\n    resources: [{name: mig-1g.10gb}]\n",
                        "c.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("c.yaml:3: gpulet.memoryLimits.resources[0].name: "
                                      "nvidia.com/mig-1g.10gb is a MIG resource: "),
            std::string::npos)
      << r.status().message();
  r = ParseMemoryLimits(
      "flags: {migStrategy: single}\ngpulet:\n  memoryLimits:\n    resources: [{name: gpu}]\n",
      "c.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nvidia.com/gpu is a MIG resource (flags.migStrategy: "
                                      "single)"),
            std::string::npos)
      << r.status().message();
  EXPECT_TRUE(ParseMemoryLimits("flags: {migStrategy: mixed}\ngpulet:\n  memoryLimits:\n    "
                                "resources: [{name: gpu}]\n",
                                "c.yaml")
                  .ok());
}

TEST(MemoryLimitsConfig, ErrorsNameFileLineAndField) {
  auto r = ParseMemoryLimits(
      "gpulet:\n  memoryLimits:\n    resources:\n      - name: gpu\n        perReplica: lots\n",
      "c.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "c.yaml:5: gpulet.memoryLimits.resources[0].perReplica: must be auto or a size like "
            "16Gi, 512Mi or bytes, got \"lots\"");
  r = ParseMemoryLimits("gpulet:\n  memoryLimits:\n    resources: []\n", "c.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(
      r.status().message().find("c.yaml:3: gpulet.memoryLimits.resources: must be a non-empty"),
      std::string::npos)
      << r.status().message();
  r = ParseMemoryLimits(
      "gpulet:\n  memoryLimits:\n    resources: [{name: gpu}]\n    stateDir: rel\n", "c.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(
      r.status().message().find("c.yaml:4: gpulet.memoryLimits.stateDir: must be an absolute"),
      std::string::npos)
      << r.status().message();
  r = ParseMemoryLimits("gpulet:\n  memoryLimit: {}\n", "c.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gpulet.memoryLimit: unknown key (known: memoryLimits)"),
            std::string::npos)
      << r.status().message();
}

TEST(MemoryLimitsConfig, ByteSizes) {
  EXPECT_EQ(ParseByteSize("1024"), 1024u);
  EXPECT_EQ(ParseByteSize("4Ki"), 4096u);
  EXPECT_EQ(ParseByteSize("512Mi"), 512ULL << 20);
  EXPECT_EQ(ParseByteSize("2Ti"), 2ULL << 40);
  EXPECT_FALSE(ParseByteSize("0"));
  EXPECT_FALSE(ParseByteSize("16G"));
  EXPECT_FALSE(ParseByteSize("Gi"));
  EXPECT_FALSE(ParseByteSize("99999999999999999999"));
  EXPECT_FALSE(ParseByteSize("17000000Ti"));
}

}  // namespace
}  // namespace gpulet::config
