#include "metrics/memory_limits.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "cudashim/region.h"
#include "metrics/collector.h"
#include "metrics/counters.h"

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

// The exporter publishes these series through Publisher::SetExtra: after the GPU families in the
// text format, before "# EOF" in OpenMetrics.
TEST(ContainerMemoryMetrics, PublishedWithEveryRendering) {
  auto snap = std::make_shared<Snapshot>();
  auto set = ParseCounters("DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n", "t.csv");
  ASSERT_TRUE(set.ok());
  snap->counters = std::make_shared<const CounterSet>(std::move(set).value());
  EntitySample e;
  e.gpu = {0, "GPU-0", "00000000:10:00.0", "H100"};
  e.values = {Value::Int(42)};
  snap->entities.push_back(e);
  snap->gpus.push_back({e.gpu, true, ""});
  Publisher pub;
  pub.SetSnapshot(snap);
  const std::string extra = RenderContainerMemory({{{"ml", "p", "c"}, "GPU-0", 5, 10}});
  pub.SetExtra(extra);
  auto r = pub.Current();
  ASSERT_NE(r, nullptr);
  EXPECT_NE(r->text.find("DCGM_FI_DEV_GPU_TEMP"), std::string::npos);
  EXPECT_EQ(r->text.substr(r->text.size() - extra.size()), extra);
  const std::string tail = extra + "# EOF\n";
  EXPECT_EQ(r->openmetrics.substr(r->openmetrics.size() - tail.size()), tail);
  const uint64_t generation = r->generation;
  pub.SetExtra(extra);  // unchanged: no new rendering
  EXPECT_EQ(pub.Current()->generation, generation);
}

}  // namespace
}  // namespace gpulet::metrics
