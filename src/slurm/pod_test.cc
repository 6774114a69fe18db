#include "slurm/pod.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>

#include "slurm/fake_runner.h"

namespace gpulet::slurm {
namespace {

using testing::FakeRunner;
using ::testing::HasSubstr;

// What NVML shows in a container: `whole` GPUs, then one GPU in MIG mode with `migs` devices.
gpu::Inventory Container(std::vector<std::string> whole, std::vector<std::string> migs = {}) {
  gpu::Inventory inv;
  unsigned i = 0;
  for (const std::string& u : whole) {
    gpu::Gpu g;
    g.index = i++;
    g.uuid = u;
    g.name = "NVIDIA H100 80GB HBM3";
    inv.gpus.push_back(g);
  }
  if (!migs.empty()) {
    gpu::Gpu g;
    g.index = i++;
    g.uuid = "GPU-migparent";
    g.name = "NVIDIA A100-SXM4-40GB";
    g.mig_capable = g.mig_enabled = true;
    for (const std::string& u : migs) {
      gpu::MigDevice m;
      m.uuid = u;
      m.profile = "1g.5gb";
      m.mig_index = static_cast<unsigned>(g.mig_devices.size());
      g.mig_devices.push_back(m);
    }
    inv.gpus.push_back(g);
  }
  inv.links.assign(inv.gpus.size(), std::vector<gpu::Link>(inv.gpus.size()));
  return inv;
}

TEST(PodAllocation, ParsesTheEnvironmentAndRefusesNoAllocation) {
  Result<std::vector<std::string>> ids = ParseAllocatedDevices("GPU-a, GPU-b,GPU-a");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<std::string>{"GPU-a", "GPU-b"}));
  for (const char* bad : {"", "all", "none", "void", " , "}) {
    Result<std::vector<std::string>> r = ParseAllocatedDevices(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("NVIDIA_VISIBLE_DEVICES")) << bad;
  }
}

TEST(PodAllocation, UuidsThatAgreeGiveTheDevices) {
  Result<PodDevices> d = MatchAllocation(Container({"GPU-a", "GPU-b"}, {"MIG-x", "MIG-y"}),
                                         {"MIG-y", "GPU-b", "GPU-a", "MIG-x"});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->gpus, (std::vector<std::string>{"GPU-a", "GPU-b"}));
  EXPECT_EQ(d->migs, (std::vector<std::string>{"MIG-x", "MIG-y"}));
}

TEST(PodAllocation, ParentUuidCoversItsMigDevices) {
  Result<PodDevices> d = MatchAllocation(Container({}, {"MIG-x", "MIG-y"}), {"GPU-migparent"});
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->migs.size(), 2u);
}

TEST(PodAllocation, DisagreementNamesBothSides) {
  Result<PodDevices> d = MatchAllocation(Container({"GPU-a", "GPU-c"}), {"GPU-a", "GPU-b"});
  ASSERT_FALSE(d.ok());
  const std::string& m = d.status().message();
  EXPECT_THAT(m, HasSubstr("NVIDIA_VISIBLE_DEVICES names GPU-a,GPU-b"));
  EXPECT_THAT(m, HasSubstr("NVML in this container sees GPU-a,GPU-c"));
  EXPECT_THAT(m, HasSubstr("allocated, not seen: GPU-b"));
  EXPECT_THAT(m, HasSubstr("seen, not allocated: GPU-c"));
}

TEST(PodAllocation, MoreSeenThanAllocatedIsRefused) {
  Result<PodDevices> d = MatchAllocation(Container({"GPU-a", "GPU-b"}), {"GPU-a"});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("seen, not allocated: GPU-b"));
  Result<PodDevices> none = MatchAllocation(Container({}), {"GPU-a"});
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("sees no GPU"));
}

// DRA (issue 22 item 6): GPULET_DRA_DEVICES as gpulet dra's CDI edits set it.
TEST(PodAllocation, DraDevicesGiveTheirUuids) {
  Result<std::vector<std::string>> ids = ParseDraDevices(
      "gpu-0=GPU-a, gpu-3-mem=GPU-b,gpu-3-mem=GPU-b, gpu-1-mig-1g-10gb-me-0=MIG-x,gpu-0=GPU-a");
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  // Two shares of GPU 3 are one GPU; the same device twice is one.
  EXPECT_EQ(*ids, (std::vector<std::string>{"GPU-a", "GPU-b", "MIG-x"}));
  // Names without a UUID count, as index entries do.
  ids = ParseDraDevices("gpu-2,gpu-2-mem,gpu-5-mig-3g-40gb-4");
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  EXPECT_EQ(*ids, (std::vector<std::string>{"2", "5:4"}));
  struct Bad {
    const char* value;
    const char* says;
  };
  for (const Bad& b : std::vector<Bad>{
           {"", "no devices"},
           {" , ", "no devices"},
           {"gpu0=GPU-a", "\"gpu0\" is not a device of gpu.gpulet.io"},
           {"nvidia0=GPU-a", "is not a device of gpu.gpulet.io"},
           {"gpu-0=MIG-x", "gpu-0=MIG-x: a GPU's UUID (GPU-…) expected"},
           {"gpu-1-mig-1g-10gb-0=GPU-a", "a MIG device's UUID (MIG-…) expected"},
           {"gpu-0=", "a GPU's UUID"},
       }) {
    Result<std::vector<std::string>> r = ParseDraDevices(b.value);
    ASSERT_FALSE(r.ok()) << b.value;
    EXPECT_THAT(r.status().message(), HasSubstr("GPULET_DRA_DEVICES")) << b.value;
    EXPECT_THAT(r.status().message(), HasSubstr(b.says)) << b.value;
  }
}

TEST(PodAllocation, DraDevicesAreMatchedAgainstNvml) {
  Result<std::vector<std::string>> ids = ParseDraDevices("gpu-4=GPU-a,gpu-6-mem=GPU-b");
  ASSERT_TRUE(ids.ok());
  Result<PodDevices> d = MatchAllocation(Container({"GPU-a", "GPU-b"}), *ids, kDraDevicesEnv);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->gpus, (std::vector<std::string>{"GPU-a", "GPU-b"}));
  Result<PodDevices> bad = MatchAllocation(Container({"GPU-a", "GPU-c"}), *ids, kDraDevicesEnv);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("GPULET_DRA_DEVICES names GPU-a,GPU-b"));
  EXPECT_THAT(bad.status().message(), HasSubstr("allocated, not seen: GPU-b"));
}

TEST(PodAllocation, IndexEntriesAreCheckedByCount) {
  EXPECT_TRUE(MatchAllocation(Container({"GPU-a", "GPU-b"}), {"4", "5"}).ok());
  EXPECT_TRUE(MatchAllocation(Container({}, {"MIG-x"}), {"3:1"}).ok());
  Result<PodDevices> d = MatchAllocation(Container({"GPU-a", "GPU-b"}), {"4"});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("1 GPU(s) and 0 MIG device(s) for GPU-a,GPU-b"));
}

TEST(PodLabels, DownwardApiFileAndFeatures) {
  std::map<std::string, std::string> labels = ParsePodLabels(
      "app=\"slurmd\"\nslurm.gpulet.io/partition=\"h100\"\n"
      "slurm.gpulet.io/features=\"nvlink, ib,h100\"\nbroken line\n");
  EXPECT_EQ(labels.at("app"), "slurmd");
  Result<std::vector<std::string>> f = NodeFeatures(labels, "");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f, (std::vector<std::string>{"h100", "nvlink", "ib"}));
  Result<std::vector<std::string>> o = NodeFeatures(labels, "debug");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->front(), "debug");
  EXPECT_TRUE(NodeFeatures({}, "")->empty());
  Result<std::vector<std::string>> bad = NodeFeatures({{kPodFeaturesLabel, "a b"}}, "");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("\"a b\""));
}

TEST(PodCpus, CoresAreNumberedAmongTheContainersCores) {
  // Machine: CPUs 0-3 are cores 0-3, CPUs 4-7 their hyperthreads. Container: CPUs 2,3,6,7.
  std::map<unsigned, unsigned> topo;
  for (unsigned c = 0; c < 8; ++c) topo[c] = c % 4;
  std::map<unsigned, unsigned> idx = ContainerCoreIndex({2, 3, 6, 7}, topo);
  EXPECT_EQ(idx, (std::map<unsigned, unsigned>{{2, 0}, {3, 1}, {6, 0}, {7, 1}}));
  EXPECT_EQ(ContainerCoreIndex({5, 9}, {}), (std::map<unsigned, unsigned>{{5, 0}, {9, 1}}));
}

TEST(PodMemory, CgroupLimitCappedByMemTotal) {
  EXPECT_EQ(ContainerMemoryMib("2147483648\n", 64u << 20), 2048u);
  EXPECT_EQ(ContainerMemoryMib("max\n", 8u << 20), 8192u);
  EXPECT_EQ(ContainerMemoryMib("1099511627776", 8u << 20), 8192u);
}

TEST(PodCpus, ACfsQuotaLowersTheCpusetCount) {
  // A 4-CPU pod on a 192-core host (cgroup v2 cpu.max).
  EXPECT_EQ(ContainerCpus(192, CpuQuotaFromCpuMax("400000 100000\n")), 4u);
  EXPECT_EQ(ContainerCpus(192, CpuQuotaFromCpuMax("max 100000\n")), 192u);
  // A fraction rounds up; never more than the cpuset, never fewer than one.
  EXPECT_EQ(ContainerCpus(192, CpuQuotaFromCpuMax("150000 100000")), 2u);
  EXPECT_EQ(ContainerCpus(2, CpuQuotaFromCpuMax("400000 100000")), 2u);
  EXPECT_EQ(ContainerCpus(8, CpuQuotaFromCpuMax("10000 100000")), 1u);
  EXPECT_EQ(ContainerCpus(0, std::nullopt), 1u);
  // cgroup v1: cpu.cfs_quota_us / cpu.cfs_period_us; -1 is no quota.
  EXPECT_EQ(CpuQuotaFromCfs("250000\n", "50000\n"), 5.0);
  EXPECT_EQ(CpuQuotaFromCfs("-1\n", "100000\n"), std::nullopt);
  EXPECT_EQ(CpuQuotaFromCfs("100000", "0"), std::nullopt);
  EXPECT_EQ(CpuQuotaFromCpuMax(""), std::nullopt);
  EXPECT_EQ(CpuQuotaFromCpuMax("garbage"), std::nullopt);
}

// Files under a temp directory: cgroup trees as a container sees them at --cgroup-root, Slurm
// configuration mounts.
class PodFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("gpulet-cgroup-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    std::filesystem::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  std::filesystem::path root_;
};

TEST_F(PodFiles, V2CpuMaxAndMemoryMax) {
  Write("cpu.max", "400000 100000\n");
  Write("memory.max", "4294967296\n");
  Write("cpu,cpuacct/cpu.cfs_quota_us", "-1\n");  // v1 leftovers lose to v2
  Write("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const CgroupLimits l = ReadCgroupLimits(root_.string());
  EXPECT_EQ(l.cpu_quota, 4.0);
  EXPECT_EQ(l.cpu_source, (root_ / "cpu.max").string());
  EXPECT_EQ(ContainerCpus(192, l.cpu_quota), 4u);
  EXPECT_EQ(ContainerMemoryMib(l.memory_limit, 64u << 20), 4096u);
}

TEST_F(PodFiles, V1ControllerDirectories) {
  Write("cpu,cpuacct/cpu.cfs_quota_us", "400000\n");
  Write("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  Write("memory/memory.limit_in_bytes", "8589934592\n");
  const CgroupLimits l = ReadCgroupLimits(root_.string());
  EXPECT_EQ(ContainerCpus(192, l.cpu_quota), 4u);
  EXPECT_EQ(l.memory_source, (root_ / "memory" / "memory.limit_in_bytes").string());
  EXPECT_EQ(ContainerMemoryMib(l.memory_limit, 64u << 20), 8192u);
}

TEST_F(PodFiles, V1CpuOnlyDirectoryAndNoLimits) {
  Write("cpu/cpu.cfs_quota_us", "-1\n");
  Write("cpu/cpu.cfs_period_us", "100000\n");
  Write("memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  const CgroupLimits l = ReadCgroupLimits(root_.string());
  EXPECT_EQ(l.cpu_quota, std::nullopt);
  EXPECT_EQ(l.cpu_source, (root_ / "cpu" / "cpu.cfs_quota_us").string());
  EXPECT_EQ(ContainerCpus(192, l.cpu_quota), 192u);
  EXPECT_EQ(ContainerMemoryMib(l.memory_limit, 64u << 20), 65536u);
}

TEST_F(PodFiles, NoCgroupFilesMeanNoLimits) {
  const CgroupLimits l = ReadCgroupLimits((root_ / "absent").string());
  EXPECT_EQ(l.cpu_quota, std::nullopt);
  EXPECT_EQ(l.memory_limit, "");
  EXPECT_EQ(ContainerMemoryMib(l.memory_limit, 8u << 20), 8192u);
}

// The Slurm configuration directory as a ConfigMap and a Secret mount it: files that are symlinks
// into ..data, a 0600 secret owned by slurm.
TEST_F(PodFiles, ConfDirCopiesKeepModeAndOwner) {
  const std::filesystem::path src = root_ / "etc-slurm", dst = root_ / "run";
  std::filesystem::create_directories(src / "..data");
  auto file = [&](const std::string& name, const std::string& text, mode_t mode) {
    std::ofstream(src / "..data" / name) << text;
    ASSERT_EQ(::chmod((src / "..data" / name).c_str(), mode), 0);
    std::filesystem::create_symlink(std::filesystem::path("..data") / name, src / name);
  };
  file("slurm.conf", "ClusterName=c\n", 0644);
  file("jwt_hs256.key", "secret\n", 0600);
  file("slurmdbd.conf", "StoragePass=x\n", 0600);
  file("cgroup.conf", "ConstrainCores=yes\n", 0640);
  file("gres.conf", "# not this one\n", 0644);
  // Owners as a Secret's fsGroup or an initContainer leave them (only root may give files away).
  const uid_t uid = ::geteuid() == 0 ? 64030 : ::geteuid();
  const gid_t gid = ::geteuid() == 0 ? 64031 : ::getegid();
  ASSERT_EQ(::chown((src / "..data" / "jwt_hs256.key").c_str(), uid, gid), 0);

  Result<std::string> conf =
      PrepareConfDir((src / "slurm.conf").string(), dst.string(), "# gres\n");
  ASSERT_TRUE(conf.ok()) << conf.status().message();
  EXPECT_EQ(*conf, (dst / "slurm.conf").string());
  auto mode_of = [](const std::filesystem::path& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  };
  EXPECT_EQ(mode_of(dst / "slurm.conf"), 0644u);
  EXPECT_EQ(mode_of(dst / "jwt_hs256.key"), 0600u);
  EXPECT_EQ(mode_of(dst / "slurmdbd.conf"), 0600u);
  EXPECT_EQ(mode_of(dst / "cgroup.conf"), 0640u);
  EXPECT_EQ(mode_of(dst / "gres.conf"), 0644u);
  struct stat st {};
  ASSERT_EQ(::lstat((dst / "jwt_hs256.key").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));  // a copy, not a link into the mount
  EXPECT_EQ(st.st_uid, uid);
  EXPECT_EQ(st.st_gid, gid);
  std::ifstream key(dst / "jwt_hs256.key");
  std::string text((std::istreambuf_iterator<char>(key)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "secret\n");
  std::ifstream gres(dst / "gres.conf");
  std::string g((std::istreambuf_iterator<char>(gres)), std::istreambuf_iterator<char>());
  EXPECT_EQ(g, "# gres\n");
  EXPECT_FALSE(std::filesystem::exists(dst / "..data"));

  // A second start (the container restarted) replaces the copies, modes still kept.
  ASSERT_EQ(::chmod((src / "..data" / "slurmdbd.conf").c_str(), 0400), 0);
  ASSERT_TRUE(PrepareConfDir((src / "slurm.conf").string(), dst.string(), "# gres\n").ok());
  EXPECT_EQ(mode_of(dst / "slurmdbd.conf"), 0400u);
}

TEST(PodConfDir, MissingSlurmConfNamesIt) {
  Result<std::string> r =
      PrepareConfDir("/nonexistent/slurm.conf", ::testing::TempDir() + "gpulet-confdir-none", "");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/slurm.conf: no slurm.conf"));
}

// "Registered" is a record of this pod's slurmd, not one an earlier pod of the same name left.
TEST(PodRegistration, OnlyARecordOfASlurmdStartedSinceCounts) {
  const auto started = std::chrono::system_clock::now();
  auto at = [](std::chrono::system_clock::time_point t) {
    const std::time_t tt = std::chrono::system_clock::to_time_t(t);
    std::tm tm{};
    localtime_r(&tt, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%FT%T", &tm);
    NodeStatus s;
    s.name = "slurmd-0";
    s.state = "IDLE";
    s.slurmd_start_time = buf;
    return s;
  };
  EXPECT_TRUE(RegisteredSince(at(started), started));  // the same second
  EXPECT_TRUE(RegisteredSince(at(started + std::chrono::seconds(3)), started));
  EXPECT_FALSE(RegisteredSince(at(started - std::chrono::hours(2)), started));
  EXPECT_FALSE(RegisteredSince(at(started - std::chrono::seconds(2)), started));
  NodeStatus none = at(started);
  for (const char* v : {"None", "", "Unknown", "2026-12-04", "2026-12-04T13:40:05Z"}) {
    none.slurmd_start_time = v;
    EXPECT_FALSE(RegisteredSince(none, started)) << v;
  }
  // As scontrol prints it.
  Result<NodeStatus> parsed = ParseNodeStatus(
      "NodeName=slurmd-0 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=4 State=IDLE+DYNAMIC_NORM "
      "BootTime=2026-12-04T10:00:00 SlurmdStartTime=2026-12-04T13:40:05 LastBusyTime=None "
      "Reason=x");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->slurmd_start_time, "2026-12-04T13:40:05");
}

TEST(PodConf, DynamicNodeLine) {
  NodeGres g;
  GresRecord r;
  r.name = "gpu";
  r.type = "h100";
  r.files = {"/dev/nvidia4"};
  g.records = {r, r};
  EXPECT_EQ(DynamicNodeConf(g, 8, 4096, {"h100", "ib"}),
            "CPUs=8 RealMemory=4096 Gres=gpu:h100:2 Feature=h100,ib");
  EXPECT_EQ(DynamicNodeConf(g, 0, 0, {}), "Gres=gpu:h100:2");
}

TEST(PodState, BusyFromNodeState) {
  auto busy = [](const std::string& state) { return NodeBusy(NodeStatus{"n", state, ""}); };
  EXPECT_TRUE(busy("ALLOCATED"));
  EXPECT_TRUE(busy("MIXED+DRAIN"));
  EXPECT_TRUE(busy("IDLE+COMPLETING+DRAIN"));
  EXPECT_FALSE(busy("IDLE+DRAIN"));
  EXPECT_FALSE(busy("IDLE+DYNAMIC_NORM"));
  EXPECT_EQ(BusyLabelPatch(true), R"({"metadata":{"labels":{"slurm.gpulet.io/busy":"true"}}})");
}

CommandOutput Out(const std::string& out) { return CommandOutput{0, out, "", false}; }

TEST(PodNodeTest, TerminationDrainsWaitsForJobsAndDeletes) {
  auto runner = std::make_shared<FakeRunner>();
  PodNode node(runner, "slurmd-1");
  runner->On("scontrol show node -o slurmd-1", Out("NodeName=slurmd-1 State=ALLOCATED Reason=\n"));
  runner->On("scontrol update NodeName=slurmd-1 State=DRAIN Reason=gpulet: pod terminating",
             Out(""));
  Result<PodNode::DrainOutcome> d = node.DrainForTermination();
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(*d, PodNode::DrainOutcome::kDrained);

  runner->On("scontrol show node -o slurmd-1",
             Out("NodeName=slurmd-1 State=MIXED+DRAIN Reason=gpulet: pod terminating\n"));
  int polls = 0;
  Result<NodeStatus> idle = node.WaitIdle(std::chrono::milliseconds(10), [&](auto) {
    if (++polls == 2) {
      runner->On("scontrol show node -o slurmd-1",
                 Out("NodeName=slurmd-1 State=IDLE+DRAIN Reason=gpulet: pod terminating\n"));
    }
    return true;
  });
  ASSERT_TRUE(idle.ok()) << idle.status().message();
  EXPECT_EQ(polls, 2);
  EXPECT_EQ(idle->state, "IDLE+DRAIN");

  runner->On("scontrol delete nodename=slurmd-1", Out(""));
  EXPECT_TRUE(node.Delete().ok());
  EXPECT_EQ(runner->calls().back(), "scontrol delete nodename=slurmd-1");
}

TEST(PodNodeTest, AdminDrainIsKeptAndWaitCanGiveUp) {
  auto runner = std::make_shared<FakeRunner>();
  PodNode node(runner, "slurmd-0");
  runner->On(
      "scontrol show node -o slurmd-0",
      Out("NodeName=slurmd-0 State=MIXED+DRAIN Reason=bad fan [root@2026-12-01T00:00:00]\n"));
  Result<PodNode::DrainOutcome> d = node.DrainForTermination();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, PodNode::DrainOutcome::kAdminDrainKept);
  for (const std::string& c : runner->calls()) EXPECT_THAT(c, ::testing::Not(HasSubstr("update")));
  Result<NodeStatus> idle =
      node.WaitIdle(std::chrono::milliseconds(10), [](auto) { return false; });
  ASSERT_FALSE(idle.ok());
  EXPECT_THAT(idle.status().message(), HasSubstr("still has jobs (MIXED+DRAIN)"));
}

TEST(PodNodeTest, DeleteOfAGoneNodeSucceedsBusyFails) {
  auto runner = std::make_shared<FakeRunner>();
  PodNode node(runner, "slurmd-2");
  runner->On(
      "scontrol delete nodename=slurmd-2",
      CommandOutput{1, "", "delete_node nodename=slurmd-2: Invalid node name specified", false});
  EXPECT_TRUE(node.Delete().ok());
  runner->On(
      "scontrol delete nodename=slurmd-2",
      CommandOutput{1, "", "delete_node nodename=slurmd-2: Requested nodes are busy", false});
  Status s = node.Delete();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("Requested nodes are busy"));
}

}  // namespace
}  // namespace gpulet::slurm
