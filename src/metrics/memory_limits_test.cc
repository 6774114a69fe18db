#include "metrics/memory_limits.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "cudashim/region.h"

namespace gpulet::metrics {
namespace {

TEST(ContainerMemoryMetrics, ReadsRegionsAndNamesTheirContainers) {
  char tmpl[] = "/tmp/gpulet-memmetrics-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string state = tmpl;
  std::filesystem::create_directories(state + "/a1");
  std::filesystem::create_directories(state + "/a2");
  std::filesystem::create_directories(state + "/not-ours");
  std::ofstream(state + "/a1/devices") << "GPU-0::0\nGPU-0::1\n";
  std::ofstream(state + "/a2/devices") << "GPU-1::3\n";
  ASSERT_EQ(cudashim::CreateRegion(state + "/a1", {{"GPU-0", 1000, 0}}), "");
  ASSERT_EQ(cudashim::CreateRegion(state + "/a2", {{"GPU-1", 500, 0}}), "");
  {
    cudashim::Region r;
    ASSERT_EQ(r.Open(state + "/a1"), "");
    ASSERT_TRUE(r.Admit(r.Attach(), 0, 960));
  }
  auto samples = ReadContainerMemory(state, {{"GPU-0::1", {"ml", "train-0", "main"}}});
  std::sort(samples.begin(), samples.end(),
            [](const ContainerMemory& a, const ContainerMemory& b) { return a.uuid < b.uuid; });
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].owner.pod, "train-0");
  EXPECT_EQ(samples[0].used, 960u);
  EXPECT_EQ(samples[0].limit, 1000u);
  EXPECT_EQ(samples[1].owner.pod, "");  // not listed by the kubelet (yet)
  const std::string text = RenderContainerMemory(samples);
  EXPECT_NE(text.find("# TYPE gpulet_container_memory_used_bytes gauge\n"), std::string::npos);
  EXPECT_NE(text.find("gpulet_container_memory_used_bytes{namespace=\"ml\",pod=\"train-0\","
                      "container=\"main\",UUID=\"GPU-0\"} 960\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("gpulet_container_memory_limit_bytes{namespace=\"\",pod=\"\",container=\"\","
                      "UUID=\"GPU-1\"} 500\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(RenderContainerMemory({}), "");
  std::filesystem::remove_all(state);
}

}  // namespace
}  // namespace gpulet::metrics
