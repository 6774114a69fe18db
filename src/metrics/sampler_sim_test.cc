// The sampler through the real dlopen path against the simulated driver: the readings that need
// more than one plain query (field values, memory info v2, GPM profiling samples).
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "metrics/counters.h"
#include "metrics/sampler.h"
#include "sim/sim_node.h"

namespace gpulet::metrics {
namespace {

struct Opened {
  gpu::testing::SimNode sim;
  gpu::Inventory inventory;
};

std::unique_ptr<Opened> Open(const std::string& fixture) {
  Result<gpu::testing::SimNode> sim = gpu::testing::OpenSimNode(fixture);
  EXPECT_TRUE(sim.ok()) << sim.status().message();
  if (!sim.ok()) return nullptr;
  Result<gpu::Inventory> inv = gpu::Discover(*sim->nvml, sim->options);
  EXPECT_TRUE(inv.ok()) << inv.status().message();
  if (!inv.ok()) return nullptr;
  return std::make_unique<Opened>(Opened{*sim, *inv});
}

std::shared_ptr<const CounterSet> Counters(const std::string& csv) {
  Result<CounterSet> set = ParseCounters(csv, "test.csv");
  EXPECT_TRUE(set.ok()) << set.status().message();
  return std::make_shared<const CounterSet>(set.ok() ? *set : CounterSet{});
}

const char* kProfiling =
    "DCGM_FI_DEV_GPU_UTIL, gauge, util\n"
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, gr\n"
    "DCGM_FI_PROF_SM_ACTIVE, gauge, sm\n"
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, tensor\n"
    "DCGM_FI_PROF_DRAM_ACTIVE, gauge, dram\n"
    "DCGM_FI_PROF_PCIE_TX_BYTES, gauge, tx\n"
    "DCGM_FI_PROF_PCIE_RX_BYTES, gauge, rx\n"
    "DCGM_FI_PROF_NVLINK_TX_BYTES, gauge, nvtx\n";

// Values of entity `e` by field name.
std::map<std::string, Value> ByName(const Snapshot& s, size_t e) {
  std::map<std::string, Value> out;
  for (size_t m = 0; m < s.counters->metrics.size(); ++m) {
    if (s.entities[e].values[m]) out[s.counters->metrics[m].field] = *s.entities[e].values[m];
  }
  return out;
}

TEST(SamplerOnSimulator, GpmProfilingOnHopperFromTheFirstCollection) {
  auto node = Open("dgx-h100");
  ASSERT_NE(node, nullptr);
  Sampler sampler(node->sim.nvml->fn(), node->inventory, "host", nullptr);
  auto counters = Counters(kProfiling);

  // The first collection primes GPM (one sample, a short wait) so it already has values; later
  // ones average over the interval since the previous collection.
  for (int collection = 0; collection < 2; ++collection) {
    Snapshot snap = sampler.Sample(counters);
    ASSERT_EQ(snap.entities.size(), 8u);
    for (size_t e = 0; e < snap.entities.size(); ++e) {
      auto v = ByName(snap, e);
      EXPECT_EQ(v.count("DCGM_FI_DEV_GPU_UTIL"), 1u);
      for (const char* ratio : {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
                                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"}) {
        ASSERT_EQ(v.count(ratio), 1u) << ratio;
        EXPECT_TRUE(v[ratio].is_double) << ratio;
        EXPECT_GE(v[ratio].d, 0.0) << ratio;
        EXPECT_LE(v[ratio].d, 1.0) << ratio;
      }
      // The engine is at least as busy as its SMs, and tensor pipes no busier than the SMs.
      EXPECT_GE(v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].d, v["DCGM_FI_PROF_SM_ACTIVE"].d);
      EXPECT_LE(v["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].d, v["DCGM_FI_PROF_SM_ACTIVE"].d);
      for (const char* rate : {"DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
                               "DCGM_FI_PROF_NVLINK_TX_BYTES"}) {
        ASSERT_EQ(v.count(rate), 1u) << rate;
        EXPECT_FALSE(v[rate].is_double) << rate;
        EXPECT_GE(v[rate].i, 0) << rate;
      }
    }
  }
}

TEST(SamplerOnSimulator, GpmIsSkippedOnAmpereAndPerInstanceOnMig) {
  auto node = Open("dgx-a100");
  ASSERT_NE(node, nullptr);
  Sampler sampler(node->sim.nvml->fn(), node->inventory, "host", nullptr);
  auto counters = Counters(kProfiling);
  sampler.Sample(counters);
  Snapshot s = sampler.Sample(counters);
  ASSERT_FALSE(s.entities.empty());
  for (size_t e = 0; e < s.entities.size(); ++e) {
    auto v = ByName(s, e);
    EXPECT_EQ(v.count("DCGM_FI_PROF_GR_ENGINE_ACTIVE"), 0u) << "A100 has no GPM";
    if (s.entities[e].mig_profile.empty()) {
      EXPECT_EQ(v.count("DCGM_FI_DEV_GPU_UTIL"), 1u);
    }
  }
}

TEST(SamplerOnSimulator, MemoryTemperatureReservedMemoryAndNvlinkCounter) {
  auto node = Open("dgx-h100");
  ASSERT_NE(node, nullptr);
  Sampler sampler(node->sim.nvml->fn(), node->inventory, "host", nullptr);
  auto counters = Counters(
      "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"
      "DCGM_FI_DEV_MEMORY_TEMP, gauge, mt\n"
      "DCGM_FI_DEV_FB_RESERVED, gauge, r\n"
      "DCGM_FI_DEV_FB_FREE, gauge, f\n"
      "DCGM_FI_DEV_FB_USED, gauge, u\n"
      "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, nv\n");
  Snapshot a = sampler.Sample(counters);
  Snapshot b = sampler.Sample(counters);
  for (size_t e = 0; e < b.entities.size(); ++e) {
    auto va = ByName(a, e);
    auto v = ByName(b, e);
    ASSERT_EQ(v.size(), 6u);
    EXPECT_GT(v["DCGM_FI_DEV_MEMORY_TEMP"].i, 0);
    EXPECT_LE(v["DCGM_FI_DEV_MEMORY_TEMP"].i, v["DCGM_FI_DEV_GPU_TEMP"].i + 10);
    // Reserved memory is part of the total: free + used + reserved stays within it.
    EXPECT_GT(v["DCGM_FI_DEV_FB_RESERVED"].i, 0);
    EXPECT_LE(v["DCGM_FI_DEV_FB_RESERVED"].i + v["DCGM_FI_DEV_FB_USED"].i,
              static_cast<int64_t>(node->inventory.gpus[e].memory_mib));
    EXPECT_GE(v["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"].i, va["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"].i)
        << "a counter never goes back";
  }
}

TEST(SamplerOnSimulator, PcieOnlyGpuHasNoNvlinkCounter) {
  auto node = Open("l4-pcie");
  ASSERT_NE(node, nullptr);
  Sampler sampler(node->sim.nvml->fn(), node->inventory, "host", nullptr);
  auto counters = Counters(
      "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, nv\n"
      "DCGM_FI_DEV_MEMORY_TEMP, gauge, mt\n");
  Snapshot s = sampler.Sample(counters);
  ASSERT_FALSE(s.entities.empty());
  auto v = ByName(s, 0);
  EXPECT_EQ(v.count("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"), 0u);
  EXPECT_EQ(v.count("DCGM_FI_DEV_MEMORY_TEMP"), 1u);
}

}  // namespace
}  // namespace gpulet::metrics
