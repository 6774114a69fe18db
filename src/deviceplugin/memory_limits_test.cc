// Memory limits on Allocate: shares per GPU from real config text, the directory and region an
// Allocate leaves behind, and their removal once the kubelet no longer lists the devices.
#include "deviceplugin/memory_limits.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "deviceplugin/memory_limits_janitor.h"
#include "kubelet/kubelet_harness.h"
#include "sharing/test_inventories.h"

namespace gpulet::deviceplugin {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1024ULL * 1024ULL;

// Two entries of one resource: GPU 0 in 4 replicas, GPU 1 in 2 (per-GPU counts).
constexpr const char* kConfig = R"(version: v1
sharing:
  timeSlicing:
    resources:
      - {name: gpu, rename: gpu.shared, devices: [0], replicas: 4}
      - {name: gpu, rename: gpu.shared, devices: [1], replicas: 2}
gpulet:
  memoryLimits:
    resources:
      - name: gpu
    stateDir: /tmp/unused
)";

class MemoryLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cfg = config::ParseConfig(kConfig, "cfg.yaml");
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    cfg_ = *cfg;
    auto plan = sharing::BuildPlan(inv_, cfg_);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    plan_ = *plan;
    auto limits = config::ParseMemoryLimits(kConfig, "cfg.yaml");
    ASSERT_TRUE(limits.ok() && limits->has_value());
    limits_ = **limits;
    char tmpl[] = "/tmp/gpulet-memlimits-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    state_ = tmpl;
  }
  void TearDown() override { fs::remove_all(state_); }

  const sharing::Resource& Shared() const { return *plan_.Find("nvidia.com/gpu.shared"); }

  gpu::Inventory inv_ = sharing::testing::WholeGpus(4);
  config::Config cfg_;
  sharing::Plan plan_;
  config::MemoryLimits limits_;
  std::string state_;
};

TEST_F(MemoryLimitsTest, SharesFollowEachGpusReplicaCount) {
  auto settings = ResolveMemoryLimits(limits_, cfg_, plan_);
  ASSERT_TRUE(settings.ok()) << settings.status().message();
  ASSERT_EQ(settings->count("nvidia.com/gpu.shared"), 1u);
  const MemoryLimitSettings& s = settings->at("nvidia.com/gpu.shared");
  const uint64_t gpu0 = inv_.gpus[0].memory_mib * kMiB, gpu1 = inv_.gpus[1].memory_mib * kMiB;
  const std::string u0 = inv_.gpus[0].uuid, u1 = inv_.gpus[1].uuid;
  // Two replicas of GPU 0 (of 4) and one of GPU 1 (of 2).
  auto l = ContainerMemoryLimits(Shared(), inv_, s, {u0 + "::0", u0 + "::3", u1 + "::1"});
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_EQ(l->size(), 2u);
  EXPECT_EQ((*l)[0].uuid, u0);
  EXPECT_EQ((*l)[0].limit, 2 * (gpu0 / 4));
  EXPECT_EQ((*l)[1].uuid, u1);
  EXPECT_EQ((*l)[1].limit, gpu1 / 2);
  // An explicit size per replica.
  MemoryLimitSettings fixed = s;
  fixed.per_replica = 10 * 1024 * kMiB;
  l = ContainerMemoryLimits(Shared(), inv_, fixed, {u0 + "::0", u0 + "::1"});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ((*l)[0].limit, 20 * 1024 * kMiB);
  EXPECT_FALSE(ContainerMemoryLimits(Shared(), inv_, s, {"GPU-nope::0"}).ok());
}

TEST_F(MemoryLimitsTest, OnlyTimeSlicedResourcesOfThisNode) {
  auto other = config::ParseMemoryLimits(
      "gpulet:\n  memoryLimits:\n    resources:\n      - name: nvidia.com/none\n", "cfg.yaml");
  ASSERT_TRUE(other.ok());
  auto r = ResolveMemoryLimits(**other, cfg_, plan_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "cfg.yaml:4: gpulet.memoryLimits.resources[0]: nvidia.com/none: no such time-sliced "
            "or memory-pool "
            "resource on this node");
  // GPUs 2 and 3 stay on nvidia.com/gpu, unshared.
  auto whole = config::ParseMemoryLimits(
      "gpulet:\n  memoryLimits:\n    resources:\n      - name: nvidia.com/gpu\n", "cfg.yaml");
  config::Config plain = cfg_;
  plain.sharing.time_slicing->resources.clear();
  r = ResolveMemoryLimits(**whole, plain, plan_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nvidia.com/gpu is not a time-sliced resource (none)"),
            std::string::npos)
      << r.status().message();
}

TEST_F(MemoryLimitsTest, AllocateWritesTheRegionAndAnswersMountsAndEnv) {
  std::map<std::string, MemoryLimitSettings> settings = {
      {"nvidia.com/gpu.shared", {std::nullopt, "/opt/gpulet/libgpulet-cuda.so", state_}}};
  const std::string u0 = inv_.gpus[0].uuid;
  v1beta1::ContainerAllocateResponse resp;
  ASSERT_TRUE(
      ApplyMemoryLimits(settings, Shared(), inv_, {u0 + "::1", u0 + "::2"}, "a1", &resp).ok());
  EXPECT_EQ(resp.envs().at("GPULET_CUDA_DIR"), "/run/gpulet/cuda");
  ASSERT_EQ(resp.mounts_size(), 3);
  EXPECT_EQ(resp.mounts(0).container_path(), kContainerLibraryPath);
  EXPECT_EQ(resp.mounts(0).host_path(), "/opt/gpulet/libgpulet-cuda.so");
  EXPECT_TRUE(resp.mounts(0).read_only());
  EXPECT_EQ(resp.mounts(1).container_path(), "/run/gpulet/cuda");
  EXPECT_EQ(resp.mounts(1).host_path(), state_ + "/a1");
  EXPECT_FALSE(resp.mounts(1).read_only());
  EXPECT_EQ(resp.mounts(2).container_path(), "/etc/ld.so.preload");
  EXPECT_TRUE(resp.mounts(2).read_only());
  std::ifstream preload(resp.mounts(2).host_path());
  std::string line;
  std::getline(preload, line);
  EXPECT_EQ(line, kContainerLibraryPath);
  cudashim::Region region;
  ASSERT_EQ(region.Open(state_ + "/a1", /*read_only=*/true), "");
  ASSERT_EQ(region.Usage().size(), 1u);
  EXPECT_EQ(region.Usage()[0].uuid, u0);
  EXPECT_EQ(region.Usage()[0].limit, 2 * (inv_.gpus[0].memory_mib * kMiB / 4));
  struct stat st {};
  ASSERT_EQ(::stat((state_ + "/a1/memory.region").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);

  // Other resources: untouched.
  v1beta1::ContainerAllocateResponse plain;
  ASSERT_TRUE(ApplyMemoryLimits(settings, *plan_.Find("nvidia.com/gpu"), inv_, {inv_.gpus[2].uuid},
                                "a2", &plain)
                  .ok());
  EXPECT_EQ(plain.mounts_size(), 0);
  EXPECT_FALSE(fs::exists(state_ + "/a2"));
}

TEST_F(MemoryLimitsTest, DirectoriesGoOnceTheKubeletNoLongerListsTheirDevices) {
  std::map<std::string, MemoryLimitSettings> settings = {
      {"nvidia.com/gpu.shared", {std::nullopt, "/lib.so", state_}}};
  const std::string u0 = inv_.gpus[0].uuid;
  v1beta1::ContainerAllocateResponse resp;
  ASSERT_TRUE(ApplyMemoryLimits(settings, Shared(), inv_, {u0 + "::0"}, "held", &resp).ok());
  ASSERT_TRUE(ApplyMemoryLimits(settings, Shared(), inv_, {u0 + "::1"}, "gone", &resp).ok());
  const auto now = std::chrono::system_clock::now() + std::chrono::hours(1);
  // Just made: kept whatever the kubelet says (it may not have recorded the allocation yet).
  EXPECT_TRUE(RemoveReleasedContainerDirs(state_, {}, std::chrono::system_clock::now(),
                                          std::chrono::seconds(60))
                  .empty());
  auto removed = RemoveReleasedContainerDirs(state_, {u0 + "::0"}, now, std::chrono::seconds(60));
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], state_ + "/gone");
  EXPECT_TRUE(fs::exists(state_ + "/held/memory.region"));
  EXPECT_TRUE(fs::exists(state_ + "/ld.so.preload"));
}

TEST_F(MemoryLimitsTest, TheJanitorAsksTheKubelet) {
  std::map<std::string, MemoryLimitSettings> settings = {
      {"nvidia.com/gpu.shared", {std::nullopt, "/lib.so", state_}}};
  const std::string u0 = inv_.gpus[0].uuid;
  v1beta1::ContainerAllocateResponse resp;
  ASSERT_TRUE(ApplyMemoryLimits(settings, Shared(), inv_, {u0 + "::0"}, "held", &resp).ok());
  ASSERT_TRUE(ApplyMemoryLimits(settings, Shared(), inv_, {u0 + "::1"}, "gone", &resp).ok());
  const std::string kubelet = state_ + "/kubelet";
  fs::create_directories(kubelet);
  gpulet::testing::KubeletHarness harness;
  ASSERT_TRUE(harness.Start(kubelet).ok());
  harness.SetPodResources({{"ns", "p", "c", "nvidia.com/gpu.shared", {u0 + "::0"}}});
  auto owners = ListPodDevices(harness.pod_resources_socket(), std::chrono::seconds(5));
  ASSERT_TRUE(owners.ok()) << owners.status().message();
  EXPECT_EQ(owners->at(u0 + "::0"), (PodContainer{"ns", "p", "c"}));
  MemoryLimitJanitor janitor(StateDirsOf(settings), harness.pod_resources_socket(),
                             std::chrono::seconds(30), std::chrono::seconds(0));
  auto removed = janitor.RunOnce();
  ASSERT_TRUE(removed.ok()) << removed.status().message();
  EXPECT_EQ(*removed, std::vector<std::string>{state_ + "/gone"});
  EXPECT_TRUE(fs::exists(state_ + "/held"));
  // An unreachable kubelet removes nothing.
  harness.Stop();
  EXPECT_FALSE(janitor.RunOnce().ok());
  EXPECT_TRUE(fs::exists(state_ + "/held"));
}

}  // namespace
}  // namespace gpulet::deviceplugin
