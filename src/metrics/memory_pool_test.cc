#include "metrics/memory_pool.h"

#include <gtest/gtest.h>

namespace gpulet::metrics {
namespace {

TEST(MemoryPoolGauges, RenderAllocatedAndTotalPerGpu) {
  const nlohmann::json doc = nlohmann::json::parse(R"({
    "version": 1, "node": "n1", "generation": 7, "resource": "gpulet.io/gpu-memory-1gi",
    "gpus": [{"uuid": "GPU-a", "index": 0, "totalUnits": 79, "freeUnits": 59},
             {"uuid": "GPU-b", "index": 3, "totalUnits": 79, "freeUnits": 79},
             {"uuid": "GPU-c"}]})");
  const std::vector<MemoryPoolGpu> gpus = MemoryPoolFromDocument(doc);
  ASSERT_EQ(gpus.size(), 2u);  // the malformed entry is skipped
  EXPECT_EQ(gpus[0], (MemoryPoolGpu{"gpulet.io/gpu-memory-1gi", "GPU-a", 0, 79, 20}));
  MemoryPoolGauges gauges;
  EXPECT_EQ(gauges.Text(), "");
  gauges.Set(gpus);
  EXPECT_EQ(gauges.Text(),
            "# HELP gpulet_memory_pool_allocated_units Memory-pool units of this GPU allocated to "
            "containers (the device plugin's count).\n"
            "# TYPE gpulet_memory_pool_allocated_units gauge\n"
            "gpulet_memory_pool_allocated_units{gpu=\"0\",UUID=\"GPU-a\","
            "resource=\"gpulet.io/gpu-memory-1gi\"} 20\n"
            "gpulet_memory_pool_allocated_units{gpu=\"3\",UUID=\"GPU-b\","
            "resource=\"gpulet.io/gpu-memory-1gi\"} 0\n"
            "# HELP gpulet_memory_pool_units Memory-pool units this GPU is split into.\n"
            "# TYPE gpulet_memory_pool_units gauge\n"
            "gpulet_memory_pool_units{gpu=\"0\",UUID=\"GPU-a\","
            "resource=\"gpulet.io/gpu-memory-1gi\"} 79\n"
            "gpulet_memory_pool_units{gpu=\"3\",UUID=\"GPU-b\","
            "resource=\"gpulet.io/gpu-memory-1gi\"} 79\n");
  EXPECT_TRUE(MemoryPoolFromDocument(nlohmann::json::parse("[1]")).empty());
}

}  // namespace
}  // namespace gpulet::metrics
