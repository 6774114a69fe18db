// Memory limits on Allocate: shares per GPU from real config text, the directory and region an
// Allocate leaves behind, and their removal once the kubelet no longer lists the devices.
#include "deviceplugin/memory_limits.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/clock.h"
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
  ASSERT_EQ(resp.mounts_size(), 4);
  EXPECT_EQ(resp.mounts(0).container_path(), kContainerLibraryPath);
  EXPECT_EQ(resp.mounts(0).host_path(), "/opt/gpulet/libgpulet-cuda.so");
  EXPECT_TRUE(resp.mounts(0).read_only());
  // The limits: the agent's file, read-only, beside the library.
  EXPECT_EQ(resp.mounts(1).container_path(), "/usr/lib/gpulet/gpulet-cuda.limits");
  EXPECT_EQ(resp.mounts(1).host_path(), state_ + "/a1/gpulet-cuda.limits");
  EXPECT_TRUE(resp.mounts(1).read_only());
  // Only cuda/ is the container's to write.
  EXPECT_EQ(resp.mounts(2).container_path(), "/run/gpulet/cuda");
  EXPECT_EQ(resp.mounts(2).host_path(), state_ + "/a1/cuda");
  EXPECT_FALSE(resp.mounts(2).read_only());
  EXPECT_EQ(resp.mounts(3).container_path(), "/etc/ld.so.preload");
  EXPECT_TRUE(resp.mounts(3).read_only());
  std::ifstream preload(resp.mounts(3).host_path());
  std::string line;
  std::getline(preload, line);
  EXPECT_EQ(line, kContainerLibraryPath);
  cudashim::Region region;
  ASSERT_EQ(region.Open(state_ + "/a1/cuda", /*read_only=*/true), "");
  ASSERT_EQ(region.LoadLimits(resp.mounts(1).host_path()), "");
  ASSERT_EQ(region.Usage().size(), 1u);
  EXPECT_EQ(region.Usage()[0].uuid, u0);
  EXPECT_EQ(region.Usage()[0].limit, 2 * (inv_.gpus[0].memory_mib * kMiB / 4));
  EXPECT_FALSE(region.passthrough());
  struct stat st {};
  ASSERT_EQ(::stat((state_ + "/a1/cuda/memory.region").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  ASSERT_EQ(::stat((state_ + "/a1/gpulet-cuda.limits").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_EQ(st.st_uid, ::geteuid());

  // Other resources: untouched.
  v1beta1::ContainerAllocateResponse plain;
  ASSERT_TRUE(ApplyMemoryLimits(settings, *plan_.Find("nvidia.com/gpu"), inv_, {inv_.gpus[2].uuid},
                                "a2", &plain)
                  .ok());
  EXPECT_EQ(plain.mounts_size(), 0);
  EXPECT_FALSE(fs::exists(state_ + "/a2"));
}

// The config's passThrough reaches the settings the Allocate writes from.
TEST_F(MemoryLimitsTest, PassThroughFromTheConfigReachesTheSettings) {
  auto plain = ResolveMemoryLimits(limits_, cfg_, plan_);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_FALSE(plain->at("nvidia.com/gpu.shared").passthrough);
  config::MemoryLimits on = limits_;
  for (config::MemoryLimitResource& r : on.resources) r.pass_through = true;
  auto settings = ResolveMemoryLimits(on, cfg_, plan_);
  ASSERT_TRUE(settings.ok()) << settings.status().message();
  EXPECT_TRUE(settings->at("nvidia.com/gpu.shared").passthrough);
}

TEST_F(MemoryLimitsTest, PassThroughIsTheNodesChoiceWrittenInTheLimits) {
  MemoryLimitSettings s{std::nullopt, "/lib.so", state_, /*passthrough=*/true};
  v1beta1::ContainerAllocateResponse resp;
  ASSERT_TRUE(AddMemoryLimits(s, {{inv_.gpus[0].uuid, 100, 0}}, {"x"}, "p", &resp).ok());
  cudashim::LimitsFile f{};
  ASSERT_EQ(cudashim::ReadLimitsFile(state_ + "/p/gpulet-cuda.limits", &f), "");
  EXPECT_EQ(f.flags & cudashim::kLimitsPassthrough, cudashim::kLimitsPassthrough);
  for (const auto& [k, v] : resp.envs()) EXPECT_EQ(k.find("PASSTHROUGH"), std::string::npos) << k;
}

// The janitor against the kubelet harness, on a clock the test moves.
class JanitorTest : public MemoryLimitsTest {
 protected:
  void SetUp() override {
    MemoryLimitsTest::SetUp();
    settings_ = {{"nvidia.com/gpu.shared", {std::nullopt, "/lib.so", state_}}};
    kubelet_ = state_ + "-kubelet";
    fs::create_directories(kubelet_);
    ASSERT_TRUE(harness_.Start(kubelet_).ok());
    JanitorOptions o;
    o.clock = &clock_;
    janitor_ = std::make_unique<MemoryLimitJanitor>(StateDirsOf(settings_),
                                                    harness_.pod_resources_socket(), o);
  }
  void TearDown() override {
    janitor_.reset();
    harness_.Stop();
    fs::remove_all(kubelet_);
    MemoryLimitsTest::TearDown();
  }
  void Allocate(const std::vector<std::string>& ids, const std::string& name) {
    v1beta1::ContainerAllocateResponse resp;
    ASSERT_TRUE(ApplyMemoryLimits(settings_, Shared(), inv_, ids, name, &resp).ok());
  }
  // One janitor pass, `step` after the previous one.
  std::vector<std::string> Pass(std::chrono::seconds step = std::chrono::seconds(30)) {
    clock_.Advance(step);
    auto removed = janitor_->RunOnce();
    EXPECT_TRUE(removed.ok()) << removed.status().message();
    return removed.ok() ? *removed : std::vector<std::string>{};
  }
  std::string U(int gpu, int replica) const {
    return inv_.gpus[gpu].uuid + "::" + std::to_string(replica);
  }

  std::map<std::string, MemoryLimitSettings> settings_;
  std::string kubelet_;
  // The janitor's Lists here follow a FakeClock, many within a real millisecond: the kubelet's
  // rate limit (the harness's default) would refuse them, which is not what these tests are about.
  static gpulet::testing::HarnessOptions Unlimited() {
    gpulet::testing::HarnessOptions o;
    o.pod_resources_qps = 0;
    return o;
  }
  gpulet::testing::KubeletHarness harness_{Unlimited()};
  FakeClock clock_;
  std::unique_ptr<MemoryLimitJanitor> janitor_;
};

TEST_F(JanitorTest, TheJanitorAsksTheKubelet) {
  Allocate({U(0, 0)}, "held");
  Allocate({U(0, 1)}, "gone");
  harness_.SetPodResources({{"ns", "p", "c", "nvidia.com/gpu.shared", {U(0, 0)}}});
  auto owners = ListPodDevices(harness_.pod_resources_socket(), std::chrono::seconds(5));
  ASSERT_TRUE(owners.ok()) << owners.status().message();
  EXPECT_EQ(owners->devices.at(U(0, 0)), (PodContainer{"ns", "p", "c"}));
  EXPECT_TRUE(Pass().empty());
  EXPECT_TRUE(Pass().empty());
  EXPECT_EQ(Pass(), std::vector<std::string>{state_ + "/gone"});  // 3 Lists over 60 s
  EXPECT_TRUE(fs::exists(state_ + "/held/cuda/memory.region"));
  EXPECT_TRUE(fs::exists(state_ + "/ld.so.preload"));
  // An unreachable kubelet removes nothing.
  harness_.Stop();
  clock_.Advance(std::chrono::hours(1));
  EXPECT_FALSE(janitor_->RunOnce().ok());
  EXPECT_TRUE(fs::exists(state_ + "/held"));
}

// Issue 26 item 10: a directory goes by how long its devices have been missing from the
// kubelet's Lists, not by its own age: a long-running container's directory (made long ago) is
// kept through Lists that miss it for less than the span.
TEST_F(JanitorTest, ALongRunningContainersDirectoryIsNotRemovedByAge) {
  Allocate({U(0, 0)}, "old");
  const auto long_ago = fs::file_time_type::clock::now() - std::chrono::hours(24 * 30);
  for (const auto& e : fs::recursive_directory_iterator(state_ + "/old"))
    fs::last_write_time(e.path(), long_ago);
  fs::last_write_time(state_ + "/old", long_ago);
  harness_.SetPodResources({});  // one List that misses it
  EXPECT_TRUE(Pass().empty());
  EXPECT_TRUE(fs::exists(state_ + "/old"));
  harness_.SetPodResources({{"ns", "p", "c", "nvidia.com/gpu.shared", {U(0, 0)}}});
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(Pass().empty());
  EXPECT_TRUE(fs::exists(state_ + "/old"));
}

// Issue 23 item 7: a kubelet restart with running allocations, whose first Lists are empty and
// then partial, removes no directory of a running container.
TEST_F(JanitorTest, AKubeletRestartsEmptyOrPartialListsRemoveNothing) {
  Allocate({U(0, 0)}, "a");
  Allocate({U(0, 1)}, "b");
  const std::vector<gpulet::testing::PodAssignment> running = {
      {"ns", "pa", "c", "nvidia.com/gpu.shared", {U(0, 0)}},
      {"ns", "pb", "c", "nvidia.com/gpu.shared", {U(0, 1)}}};
  harness_.SetPodResources(running);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Pass().empty());
  // The kubelet restarts and, for a while, lists nothing, then only pod b.
  harness_.SetPodResources({});
  ASSERT_TRUE(harness_.Restart().ok());
  EXPECT_TRUE(Pass(std::chrono::seconds(10)).empty());
  EXPECT_TRUE(Pass(std::chrono::seconds(10)).empty());
  harness_.SetPodResources({running[1]});
  EXPECT_TRUE(Pass(std::chrono::seconds(10)).empty());
  EXPECT_TRUE(Pass(std::chrono::seconds(10)).empty());
  // Restarting again resets the evidence collected so far.
  harness_.SetPodResources({});
  ASSERT_TRUE(harness_.Restart().ok());
  EXPECT_TRUE(Pass(std::chrono::seconds(20)).empty());
  EXPECT_TRUE(Pass(std::chrono::seconds(20)).empty());
  EXPECT_TRUE(Pass(std::chrono::seconds(20)).empty());
  harness_.SetPodResources(running);
  EXPECT_TRUE(Pass().empty());
  EXPECT_TRUE(fs::exists(state_ + "/a/cuda/memory.region"));
  EXPECT_TRUE(fs::exists(state_ + "/b/cuda/memory.region"));
  // Pod a really ends: gone once the same kubelet missed it for a minute.
  harness_.SetPodResources({running[1]});
  EXPECT_TRUE(Pass().empty());
  EXPECT_TRUE(Pass().empty());
  EXPECT_EQ(Pass(), std::vector<std::string>{state_ + "/a"});
}

// Issue 23 item 8: replica IDs are reused. A newer Allocate of one of a directory's IDs ends it.
TEST_F(JanitorTest, ANewerAllocateOfTheSameIdEndsTheOlderDirectory) {
  Allocate({U(0, 0), U(0, 1)}, "first");
  Allocate({U(0, 1)}, "second");
  Allocate({U(0, 2)}, "other");
  TenantDir root = std::move(TenantDir::Open(state_)).value();
  const std::vector<ContainerDir> dirs = ReadContainerDirs(root);
  ASSERT_EQ(dirs.size(), 3u);
  EXPECT_EQ(SupersededDirs(dirs), std::set<std::string>{"first"});
  harness_.SetPodResources({{"ns", "p2", "c", "nvidia.com/gpu.shared", {U(0, 1)}},
                            {"ns", "p3", "c", "nvidia.com/gpu.shared", {U(0, 2)}}});
  EXPECT_EQ(Pass(), std::vector<std::string>{state_ + "/first"});
  EXPECT_TRUE(fs::exists(state_ + "/second"));
}

// Issue 23 item 4: what a root container can leave in the directories the janitor reads. A FIFO
// as `devices` (the old janitor's std::ifstream blocked on it forever, and plugin shutdown with
// it), a symlink to /dev/zero (getline grew until the agent was OOM-killed), symlinks out of the
// directory: the pass ends, reads nothing through them, and removes only the directory's names.
TEST_F(JanitorTest, FifosAndSymlinksInTheDirectoryNeitherBlockNorEscape) {
  Allocate({U(0, 0)}, "fifo");
  Allocate({U(0, 1)}, "zero");
  Allocate({U(0, 2)}, "gone");
  fs::remove(state_ + "/fifo/devices");
  ASSERT_EQ(::mkfifo((state_ + "/fifo/devices").c_str(), 0666), 0);
  fs::remove(state_ + "/zero/devices");
  fs::create_symlink("/dev/zero", state_ + "/zero/devices");
  const std::string outside = state_ + "-outside";
  fs::create_directories(outside);
  std::ofstream(outside + "/precious") << "keep";
  fs::create_symlink(outside, state_ + "/gone/cuda/escape");
  fs::create_symlink(outside + "/precious", state_ + "/gone/cuda/precious");
  ASSERT_EQ(::mkfifo((state_ + "/gone/cuda/pipe").c_str(), 0666), 0);
  fs::create_symlink(outside, state_ + "/linked-dir");
  harness_.SetPodResources({});
  std::vector<std::string> removed;
  for (int i = 0; i < 3; ++i) {
    for (std::string& r : Pass()) removed.push_back(std::move(r));
  }
  EXPECT_EQ(removed, std::vector<std::string>{state_ + "/gone"});
  EXPECT_TRUE(fs::exists(outside + "/precious"));
  EXPECT_TRUE(fs::is_symlink(state_ + "/linked-dir"));
  fs::remove_all(outside);
}

}  // namespace
}  // namespace gpulet::deviceplugin
