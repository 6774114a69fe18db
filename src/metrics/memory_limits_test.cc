#include "metrics/memory_limits.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/utf8.h"
#include "cudashim/region.h"
#include "deviceplugin/memory_limits.h"
#include "metrics/collector.h"
#include "metrics/counters.h"

namespace gpulet::metrics {
namespace {

class ContainerMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-memmetrics-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    state_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(state_); }
  // What the device plugin's Allocate leaves: <state>/<name>/{devices,allocation,limits,cuda/}.
  void Allocate(const std::string& name, const std::vector<std::string>& ids,
                const std::vector<cudashim::GpuLimit>& gpus) {
    deviceplugin::MemoryLimitSettings s{std::nullopt, "/lib.so", state_};
    v1beta1::ContainerAllocateResponse resp;
    Status st = deviceplugin::AddMemoryLimits(s, gpus, ids, name, &resp);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  std::string Region(const std::string& name) const {
    return state_ + "/" + name + "/cuda/memory.region";
  }
  std::string state_;
};

TEST_F(ContainerMemoryTest, ReadsRegionsAndNamesTheirContainers) {
  Allocate("a1", {"GPU-0::0", "GPU-0::1"}, {{"GPU-0", 1000, 0}});
  Allocate("a2", {"GPU-1::3"}, {{"GPU-1", 500, 0}});
  std::filesystem::create_directories(state_ + "/not-ours");
  {
    cudashim::Region r;
    ASSERT_EQ(r.Open(state_ + "/a1/cuda"), "");
    ASSERT_EQ(r.LoadLimits(state_ + "/a1/" + cudashim::kLimitsFileName), "");
    ASSERT_TRUE(r.Admit(r.Attach(), 0, 960));
  }
  auto samples = ReadContainerMemory(state_, {{"GPU-0::1", {"ml", "train-0", "main"}}});
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
}

// A node that names its driver library writes version 2 limits files (the path after the limits):
// the exporter reads their limits as it reads version 1's.
TEST_F(ContainerMemoryTest, AVersion2LimitsFileIsRead) {
  Allocate("a1", {"GPU-0::0"}, {{"GPU-0", 1000, 0}});
  ASSERT_EQ(cudashim::WriteLimitsFile(state_ + "/a1/" + cudashim::kLimitsFileName,
                                      {{"GPU-0", 700, 0}}, false,
                                      "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            "");
  auto samples = ReadContainerMemory(state_, {});
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].uuid, "GPU-0");
  EXPECT_EQ(samples[0].limit, 700u);
}

// Issue 23 item 5: the tenant rewrites its region at full speed while the exporter reads it —
// gpu_count past the slots, UUIDs without a NUL and not UTF-8, a limit of its own choosing,
// truncated to nothing and grown back. The old reader indexed the live mapping by gpu_count
// (SIGSEGV) and took SIGBUS on the truncated mapping; the limit and the labels it published came
// from the tenant. Every read here ends, and publishes only the agent's UUID and limit.
TEST_F(ContainerMemoryTest, ARegionRewrittenAndTruncatedUnderTheReaderIsReadSafely) {
  Allocate("a1", {"GPU-0::0"}, {{"GPU-0", 1000, 0}});
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    const std::string path = Region("a1");
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    std::string bad_uuid(cudashim::kUuidBytes, '\xff');
    const uint64_t huge = UINT64_MAX / 3;
    for (uint64_t i = 0; !stop.load(); ++i) {
      const uint32_t count = i % 2 == 0 ? 0xFFFFFFFFu : 1u;
      ::pwrite(fd, &count, sizeof count, offsetof(cudashim::RegionHeader, gpu_count));
      ::pwrite(fd, bad_uuid.data(), bad_uuid.size(), offsetof(cudashim::RegionLayout, gpus));
      ::pwrite(fd, &huge, sizeof huge,
               offsetof(cudashim::RegionLayout, gpus) + offsetof(cudashim::GpuSlot, unused_limit));
      if (i % 7 == 0) {
        ::ftruncate(fd, 0);
        ::ftruncate(fd, sizeof(cudashim::RegionLayout));
      }
    }
    ::close(fd);
  });
  size_t reads = 0;
  for (int i = 0; i < 300; ++i) {
    for (const ContainerMemory& m : ReadContainerMemory(state_, {})) {
      EXPECT_EQ(m.uuid, "GPU-0");
      EXPECT_EQ(m.limit, 1000u);
      ++reads;
    }
    const std::string text = RenderContainerMemory(ReadContainerMemory(state_, {}));
    EXPECT_TRUE(IsValidUtf8(text));
  }
  stop = true;
  writer.join();
  EXPECT_EQ(reads, 300u);  // the limits name the GPU whatever the region says
}

// Issue 23 items 4 and 5: a FIFO or a symlink to /dev/zero where the region was, a symlinked
// directory: nothing blocks, nothing is followed; the container's series says used 0.
TEST_F(ContainerMemoryTest, FifosAndSymlinksAreNotRead) {
  Allocate("fifo", {"GPU-0::0"}, {{"GPU-0", 1000, 0}});
  Allocate("zero", {"GPU-0::1"}, {{"GPU-0", 2000, 0}});
  std::filesystem::remove(Region("fifo"));
  ASSERT_EQ(::mkfifo(Region("fifo").c_str(), 0666), 0);
  std::filesystem::remove(Region("zero"));
  std::filesystem::create_symlink("/dev/zero", Region("zero"));
  std::filesystem::create_symlink(state_ + "/zero", state_ + "/link");
  auto samples = ReadContainerMemory(state_, {});
  ASSERT_EQ(samples.size(), 2u);
  for (const ContainerMemory& m : samples) EXPECT_EQ(m.used, 0u);
}

// Issue 23 item 5: invalid UTF-8 never reaches a label; the series is dropped, the rest stays.
TEST_F(ContainerMemoryTest, LabelsThatAreNotUtf8AreDropped) {
  const std::string text = RenderContainerMemory(
      {{{"ml", "p\xc3\x28", "c"}, "GPU-0", 5, 10}, {{"ml", "ok", "c"}, "GPU-1", 6, 10}});
  EXPECT_TRUE(IsValidUtf8(text));
  EXPECT_EQ(text.find("GPU-0"), std::string::npos) << text;
  EXPECT_NE(text.find("pod=\"ok\",container=\"c\",UUID=\"GPU-1\"} 6"), std::string::npos) << text;
}

// Issue 23 item 8: replica IDs are reused. The directory of an ended container that held
// GPU-0::1 is not labelled with the owner of the newer allocation of GPU-0::1 (no duplicate
// series, no false near-limit alert).
TEST_F(ContainerMemoryTest, AStaleDirectoryIsNotLabelledWithTheNewOwner) {
  Allocate("old", {"GPU-0::1"}, {{"GPU-0", 1000, 0}});
  {
    cudashim::Region r;
    ASSERT_EQ(r.Open(state_ + "/old/cuda"), "");
    ASSERT_EQ(r.LoadLimits(state_ + "/old/" + cudashim::kLimitsFileName), "");
    ASSERT_TRUE(r.Admit(r.Attach(), 0, 990));  // left behind by a process that never released
  }
  Allocate("new", {"GPU-0::1"}, {{"GPU-0", 1000, 0}});
  auto samples = ReadContainerMemory(state_, {{"GPU-0::1", {"ml", "new-pod", "c"}}});
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].owner.pod, "new-pod");
  EXPECT_EQ(samples[0].used, 0u);
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
