// Per-pod process attribution: cgroup parsing (v1/v2, cgroupfs/systemd, every QoS class), the
// per-pod sums, their rendering, and the reader against a fake NVML and a fake /proc.
#include "metrics/processes.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "metrics/exposition.h"

namespace gpulet::metrics {
namespace {

constexpr const char* kUid = "1c7f3a52-9b1e-4d2a-8f00-5e6d7c8b9a01";

TEST(PodUidFromCgroup, CgroupV1CgroupfsBurstable) {
  const std::string text =
      "12:pids:/kubepods/burstable/pod1c7f3a52-9b1e-4d2a-8f00-5e6d7c8b9a01/"
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"
      "11:memory:/kubepods/burstable/pod1c7f3a52-9b1e-4d2a-8f00-5e6d7c8b9a01/"
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"
      "1:name=systemd:/kubepods/burstable/pod1c7f3a52-9b1e-4d2a-8f00-5e6d7c8b9a01/0123\n"
      "0::/\n";
  EXPECT_EQ(PodUidFromCgroup(text), kUid);
}

TEST(PodUidFromCgroup, CgroupV1CgroupfsGuaranteedHasNoQosLevel) {
  EXPECT_EQ(PodUidFromCgroup("4:cpu,cpuacct:/kubepods/pod1c7f3a52-9b1e-4d2a-8f00-5e6d7c8b9a01/"
                             "abcdef\n"),
            kUid);
}

TEST(PodUidFromCgroup, CgroupV2SystemdBestEffortUsesUnderscores) {
  EXPECT_EQ(PodUidFromCgroup("0::/kubepods.slice/kubepods-besteffort.slice/"
                             "kubepods-besteffort-pod1c7f3a52_9b1e_4d2a_8f00_5e6d7c8b9a01.slice/"
                             "cri-containerd-0123456789abcdef.scope\n"),
            kUid);
}

TEST(PodUidFromCgroup, CgroupV2SystemdGuaranteedAndBurstable) {
  EXPECT_EQ(PodUidFromCgroup("0::/kubepods.slice/"
                             "kubepods-pod1c7f3a52_9b1e_4d2a_8f00_5e6d7c8b9a01.slice/"
                             "cri-containerd-abc.scope"),
            kUid);
  EXPECT_EQ(PodUidFromCgroup("0::/kubepods.slice/kubepods-burstable.slice/"
                             "kubepods-burstable-pod1c7f3a52_9b1e_4d2a_8f00_5e6d7c8b9a01.slice/"
                             "crio-abc.scope\n"),
            kUid);
}

TEST(PodUidFromCgroup, CgroupV2CgroupfsDriver) {
  EXPECT_EQ(PodUidFromCgroup("0::/kubepods/besteffort/pod1c7f3a52-9b1e-4d2a-8f00-5e6d7c8b9a01/"
                             "fedcba9876543210\n"),
            kUid);
}

TEST(PodUidFromCgroup, NotInAPod) {
  EXPECT_EQ(PodUidFromCgroup("0::/system.slice/sshd.service\n"), "");
  EXPECT_EQ(PodUidFromCgroup("0::/user.slice/user-1000.slice/session-2.scope\n"), "");
  EXPECT_EQ(PodUidFromCgroup("0::/kubepods.slice\n"), "");
  // "pod" followed by too short a hex run is not a UID.
  EXPECT_EQ(PodUidFromCgroup("0::/podcast/pod12ab/x\n"), "");
  EXPECT_EQ(PodUidFromCgroup(""), "");
  EXPECT_EQ(PodUidFromCgroup("garbage without colons\n"), "");
}

// A /proc/<pid>/stat line: fields 3..52, field 22 (start time) as given, the others their number.
std::string StatLine(unsigned pid, unsigned long long start, const std::string& comm = "python3") {
  std::string s = std::to_string(pid) + " (" + comm + ") S";
  for (int field = 4; field <= 52; ++field) {
    s += " " + (field == 22 ? std::to_string(start) : std::to_string(field));
  }
  return s + "\n";
}

TEST(ProcessStartTime, Field22CountedFromTheLastParenthesis) {
  EXPECT_EQ(ProcessStartTime(StatLine(100, 123456789)), 123456789ull);
  // A command name may hold spaces and parentheses (a tenant names its own process).
  EXPECT_EQ(ProcessStartTime(StatLine(7, 42, "a) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 (b")),
            42ull);
  EXPECT_EQ(ProcessStartTime(StatLine(7, 42, "x y")), 42ull);
}

TEST(ProcessStartTime, NotAStatLine) {
  EXPECT_EQ(ProcessStartTime(""), std::nullopt);
  EXPECT_EQ(ProcessStartTime("100 (python3) S 1 2 3"), std::nullopt);  // too few fields
  EXPECT_EQ(ProcessStartTime("no parenthesis 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"),
            std::nullopt);
  EXPECT_EQ(ProcessStartTime("1 (x) S 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 -1 23\n"),
            std::nullopt);  // a start time that is not a number
}

TEST(SumByPod, AddsProcessesOfOnePodAndSkipsUnknownOnes) {
  constexpr uint64_t kMiB = 1024 * 1024;
  std::vector<ProcessUse> procs = {
      {101, 500 * kMiB, true, 30, true, "uid-a"},
      {102, 300 * kMiB + 5, true, 45, true, "uid-a"},  // partial MiB rounds down
      {201, 1024 * kMiB, true, 50, true, "uid-b"},
      {301, 9 * kMiB, true, 10, true, ""},  // not in a pod
      {401, 0, false, 5, true, "uid-c"},    // memory not available
  };
  auto sums = SumByPod(procs);
  ASSERT_EQ(sums.size(), 3u);
  EXPECT_EQ(sums["uid-a"].sm_util, 75);
  EXPECT_EQ(sums["uid-a"].fb_used_mib, 800);
  EXPECT_EQ(sums["uid-b"].sm_util, 50);
  EXPECT_EQ(sums["uid-b"].fb_used_mib, 1024);
  EXPECT_EQ(sums["uid-c"].sm_util, 5);
  EXPECT_EQ(sums["uid-c"].fb_used_mib, 0);
}

std::shared_ptr<const CounterSet> Counters() {
  auto set = ParseCounters(
      "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"
      "DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n"
      "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n",
      "t.csv");
  EXPECT_TRUE(set.ok()) << set.status().message();
  return std::make_shared<const CounterSet>(std::move(set).value());
}

// GPU 0 shared by pods a (two processes, replicas 1 and 2), b (one process) and c (idle); GPU 1
// held by nobody.
Snapshot SharedGpu() {
  constexpr uint64_t kMiB = 1024 * 1024;
  Snapshot s;
  s.counters = Counters();
  s.hostname = "n";
  for (unsigned i = 0; i < 2; ++i) {
    EntitySample e;
    e.key = {i, -1};
    e.gpu = {i, "GPU-" + std::to_string(i), "bus" + std::to_string(i), "H100"};
    e.values = {Value::Int(90), Value::Int(7000), Value::Int(50)};
    e.processes_read = true;
    if (i == 0) {
      e.processes = {{11, 1000 * kMiB, true, 20, true, "uid-a"},
                     {12, 2000 * kMiB, true, 25, true, "uid-a"},
                     {21, 3000 * kMiB, true, 40, true, "uid-b"},
                     {99, 10 * kMiB, true, 1, true, ""}};
    }
    s.entities.push_back(e);
    s.gpus.push_back({e.gpu, true, ""});
  }
  return s;
}

PodMap SharedPods() {
  PodMap pods;
  pods[{0, -1}] = {{"ml", "a", "main", "1", "uid-a"},
                   {"ml", "a", "main", "2", "uid-a"},
                   {"ml", "b", "main", "3", "uid-b"},
                   {"ml", "c", "main", "4", "uid-c"},
                   {"ml", "d", "main", "5", ""}};  // UID unknown
  return pods;
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

TEST(ProcessSeries, PerPodUtilAndMemoryBesideTheDeviceSeries) {
  RenderOptions o;
  o.series_per_pod = true;
  const std::string text = Render(SharedGpu(), SharedPods(), o);
  const std::string base =
      "{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"bus0\",device=\"nvidia0\",modelName=\"H100\","
      "Hostname=\"n\"";
  // The device-wide value stays, without pod labels.
  EXPECT_NE(text.find("DCGM_FI_DEV_GPU_UTIL" + base + "} 90\n"), std::string::npos) << text;
  EXPECT_NE(text.find("DCGM_FI_DEV_FB_USED" + base + "} 7000\n"), std::string::npos);
  // Each replica of pod a: 20 + 25 %, 1000 + 2000 MiB.
  for (const char* vgpu : {"1", "2"}) {
    const std::string labels = base +
                               ",container=\"main\",namespace=\"ml\",pod=\"a\",pod_uid=\"uid-a\","
                               "vgpu=\"" +
                               vgpu + "\"} ";
    EXPECT_NE(text.find("DCGM_FI_DEV_GPU_UTIL" + labels + "45\n"), std::string::npos) << text;
    EXPECT_NE(text.find("DCGM_FI_DEV_FB_USED" + labels + "3000\n"), std::string::npos);
  }
  EXPECT_NE(text.find("pod=\"b\",pod_uid=\"uid-b\",vgpu=\"3\"} 40\n"), std::string::npos);
  EXPECT_NE(text.find("pod=\"b\",pod_uid=\"uid-b\",vgpu=\"3\"} 3000\n"), std::string::npos);
  // An idle holder reads 0; one whose UID is unknown gets no process series.
  EXPECT_EQ(Count(text, "pod=\"c\",pod_uid=\"uid-c\",vgpu=\"4\"} 0\n"), 2u);
  EXPECT_EQ(text.find("DCGM_FI_DEV_GPU_UTIL" + base +
                      ",container=\"main\",namespace=\"ml\","
                      "pod=\"d\""),
            std::string::npos);
  // Other fields: one copy per holder with the device's value (no pod_uid without the flag).
  EXPECT_EQ(Count(text, "DCGM_FI_DEV_GPU_TEMP" + base + ",container="), 5u);
  EXPECT_NE(text.find("DCGM_FI_DEV_GPU_TEMP" + base +
                      ",container=\"main\",namespace=\"ml\",pod=\"d\",vgpu=\"5\"} 50\n"),
            std::string::npos);
  EXPECT_EQ(text.find("DCGM_FI_DEV_GPU_TEMP" + base +
                      ",container=\"main\",namespace=\"ml\","
                      "pod=\"a\",pod_uid"),
            std::string::npos);
  // GPU 1, held by nobody: device series only.
  EXPECT_EQ(Count(text, "DCGM_FI_DEV_GPU_UTIL{gpu=\"1\""), 1u);
}

TEST(ProcessSeries, PodUidLabelWithTheFlag) {
  RenderOptions o;
  o.series_per_pod = true;
  o.pod_uid_label = true;
  const std::string text = Render(SharedGpu(), SharedPods(), o);
  EXPECT_NE(text.find("pod=\"a\",pod_uid=\"uid-a\",vgpu=\"1\"} 50\n"), std::string::npos) << text;
}

// Without --kubernetes-virtual-gpus: one series per GPU, the holders joined, no process split.
TEST(ProcessSeries, OneSeriesPerGpuByDefault) {
  RenderOptions o;
  o.series_per_pod = false;
  const std::string text = Render(SharedGpu(), SharedPods(), o);
  EXPECT_EQ(Count(text, "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\""), 1u);
  EXPECT_NE(text.find(",container=\"main,main,main,main\",namespace=\"ml,ml,ml,ml\","
                      "pod=\"a,b,c,d\"} 90\n"),
            std::string::npos)
      << text;
}

// Processes not read (NVML could not list them): per-pod copies of the device value, as for
// any other field.
TEST(ProcessSeries, NoProcessDataFallsBackToCopies) {
  Snapshot s = SharedGpu();
  s.entities[0].processes_read = false;
  s.entities[0].processes.clear();
  RenderOptions o;
  o.series_per_pod = true;
  const std::string text = Render(s, SharedPods(), o);
  EXPECT_EQ(Count(text, "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\""), 5u);
  EXPECT_EQ(Count(text,
                  "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"bus0\","
                  "device=\"nvidia0\",modelName=\"H100\",Hostname=\"n\"} "),
            0u);  // no device-only series beside the copies
  EXPECT_NE(text.find("pod=\"a\",vgpu=\"1\"} 90\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pod=\"a\",vgpu=\"1\"} 7000\n"), std::string::npos);
}

// The reader against a fake NVML table and a fake /proc.
namespace fake {
std::vector<nvmlProcessInfo_t> procs;
std::vector<nvmlProcessUtilizationSample_t> samples;
nvmlReturn_t list_rc = NVML_SUCCESS;
unsigned long long last_seen = 0;

nvmlReturn_t Running(nvmlDevice_t, unsigned* count, nvmlProcessInfo_t* infos) {
  if (list_rc != NVML_SUCCESS) return list_rc;
  const unsigned cap = infos != nullptr ? *count : 0;
  *count = static_cast<unsigned>(procs.size());
  if (cap < procs.size()) return NVML_ERROR_INSUFFICIENT_SIZE;
  for (size_t i = 0; i < procs.size(); ++i) infos[i] = procs[i];
  return NVML_SUCCESS;
}
nvmlReturn_t Util(nvmlDevice_t, nvmlProcessUtilizationSample_t* out, unsigned* count,
                  unsigned long long last) {
  last_seen = last;
  std::vector<nvmlProcessUtilizationSample_t> newer;
  for (const auto& s : samples) {
    if (s.timeStamp > last) newer.push_back(s);
  }
  if (newer.empty()) {
    *count = 0;
    return NVML_ERROR_NOT_FOUND;
  }
  const unsigned cap = out != nullptr ? *count : 0;
  *count = static_cast<unsigned>(newer.size());
  if (cap < newer.size()) return NVML_ERROR_INSUFFICIENT_SIZE;
  for (size_t i = 0; i < newer.size(); ++i) out[i] = newer[i];
  return NVML_SUCCESS;
}
}  // namespace fake

class ProcessReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("gpulet-proc-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(root_);
    fn_.nvmlDeviceGetComputeRunningProcesses_v3 = fake::Running;
    fn_.nvmlDeviceGetProcessUtilization = fake::Util;
    fake::procs.clear();
    fake::samples.clear();
    fake::list_rc = NVML_SUCCESS;
    gpu_.index = 0;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Cgroup(unsigned pid, const std::string& text) {
    std::filesystem::create_directories(root_ / std::to_string(pid));
    std::ofstream(root_ / std::to_string(pid) / "cgroup") << text;
  }
  void Stat(unsigned pid, unsigned long long start) {
    std::filesystem::create_directories(root_ / std::to_string(pid));
    std::ofstream(root_ / std::to_string(pid) / "stat") << StatLine(pid, start);
  }
  std::string UidOf(ProcessReader& reader) {
    std::map<EntityKey, std::vector<ProcessUse>> out;
    EXPECT_TRUE(reader.Read(gpu_, Dev(), &out));
    reader.EndCollection();
    const auto& procs = out[EntityKey{0, -1}];
    return procs.size() == 1 ? procs[0].pod_uid : "<" + std::to_string(procs.size()) + " procs>";
  }
  nvmlDevice_t Dev() { return reinterpret_cast<nvmlDevice_t>(&gpu_); }

  std::filesystem::path root_;
  gpu::NvmlFunctions fn_;
  gpu::Gpu gpu_;
};

TEST_F(ProcessReaderTest, ResolvesPodsAndTakesTheNewestSamplePerPid) {
  constexpr unsigned long long kMiB = 1024 * 1024;
  Cgroup(100, std::string("0::/kubepods/burstable/pod") + kUid + "/c1\n");
  Cgroup(200, "0::/system.slice/foo.service\n");
  // pid 300 has no /proc entry (exited between the two reads).
  const unsigned kNone = 0xFFFFFFFFu;
  for (unsigned i = 0; i < 12; ++i) {  // more than the reader's first guess of 8
    fake::procs.push_back(
        {i == 0 ? 100u : (i == 1 ? 200u : 300u + i), (i + 1) * kMiB, kNone, kNone});
  }
  fake::samples = {{100, 1000, 10, 0, 0, 0}, {100, 2000, 35, 0, 0, 0}, {200, 1500, 5, 0, 0, 0}};
  ProcessReader reader(fn_, root_.string());
  std::map<EntityKey, std::vector<ProcessUse>> out;
  ASSERT_TRUE(reader.Read(gpu_, Dev(), &out));
  ASSERT_EQ(out.size(), 1u);
  const auto& procs = out[EntityKey{0, -1}];
  ASSERT_EQ(procs.size(), 12u);
  EXPECT_EQ(procs[0].pid, 100u);
  EXPECT_EQ(procs[0].pod_uid, kUid);
  EXPECT_EQ(procs[0].sm_util, 35u);  // the newer of pid 100's two samples
  EXPECT_EQ(procs[0].used_bytes, kMiB);
  EXPECT_EQ(procs[1].pod_uid, "");
  EXPECT_EQ(procs[1].sm_util, 5u);
  EXPECT_EQ(procs[2].pod_uid, "");
  EXPECT_EQ(procs[2].sm_util, 0u);  // no sample: idle
  reader.EndCollection();

  // The next read asks only for samples newer than the last one seen.
  fake::samples.push_back({100, 3000, 60, 0, 0, 0});
  out.clear();
  ASSERT_TRUE(reader.Read(gpu_, Dev(), &out));
  EXPECT_EQ(fake::last_seen, 2000u);
  const auto& again = out[EntityKey{0, -1}];
  EXPECT_EQ(again[0].sm_util, 60u);
  EXPECT_EQ(again[1].sm_util, 0u);  // nothing new from pid 200
}

// A pid the GPU keeps listing, reused by a process of another pod between two collections (the
// first process exited, the kernel handed its pid out again): the new process's pod, not the
// cached one.
TEST_F(ProcessReaderTest, AReusedPidIsAttributedToItsNewPod) {
  constexpr const char* kOther = "9e8d7c6b-5a49-4382-9100-a1b2c3d4e5f6";
  Cgroup(100, std::string("0::/kubepods/burstable/pod") + kUid + "/c1\n");
  Stat(100, 5000);
  fake::procs = {{100, 1ull << 20, 0xFFFFFFFFu, 0xFFFFFFFFu}};
  ProcessReader reader(fn_, root_.string());
  EXPECT_EQ(UidOf(reader), kUid);
  // The same process (same start time) is served from the cache: its cgroup is not read again.
  Cgroup(100, "0::/unreadable-if-read-again\n");
  EXPECT_EQ(UidOf(reader), kUid);
  // pid 100 is now another process, in another pod.
  Cgroup(100, std::string("0::/kubepods/besteffort/pod") + kOther + "/c2\n");
  Stat(100, 7000);
  EXPECT_EQ(UidOf(reader), kOther);
  EXPECT_EQ(UidOf(reader), kOther);
  // ... and then a process in no pod.
  Cgroup(100, "0::/system.slice/sshd.service\n");
  Stat(100, 9000);
  EXPECT_EQ(UidOf(reader), "");
}

// Without a readable start time nothing would tell a later holder of the pid apart: read every
// time, never cached.
TEST_F(ProcessReaderTest, APidWithoutAStartTimeIsReadEveryTime) {
  constexpr const char* kOther = "9e8d7c6b-5a49-4382-9100-a1b2c3d4e5f6";
  Cgroup(100, std::string("0::/kubepods/pod") + kUid + "/c\n");
  fake::procs = {{100, 1ull << 20, 0xFFFFFFFFu, 0xFFFFFFFFu}};
  ProcessReader reader(fn_, root_.string());
  EXPECT_EQ(UidOf(reader), kUid);
  Cgroup(100, std::string("0::/kubepods/pod") + kOther + "/c\n");
  EXPECT_EQ(UidOf(reader), kOther);
}

TEST_F(ProcessReaderTest, MigProcessesGroupByGpuInstanceAndHaveNoUtilisation) {
  gpu_.mig_enabled = true;
  gpu::MigDevice a, b;
  a.gpu_instance_id = 1;
  b.gpu_instance_id = 2;
  gpu_.mig_devices = {a, b};
  Cgroup(100, std::string("0::/kubepods/pod") + kUid + "/c\n");
  fake::procs = {{100, 5ull << 20, 2, 0}};
  ProcessReader reader(fn_, root_.string());
  std::map<EntityKey, std::vector<ProcessUse>> out;
  ASSERT_TRUE(reader.Read(gpu_, Dev(), &out));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[(EntityKey{0, 1})].empty());
  ASSERT_EQ(out[(EntityKey{0, 2})].size(), 1u);
  EXPECT_EQ(out[(EntityKey{0, 2})][0].pod_uid, kUid);
  EXPECT_FALSE(out[(EntityKey{0, 2})][0].has_util);
}

TEST_F(ProcessReaderTest, ListingFailsAndNotAvailableMemory) {
  fake::list_rc = NVML_ERROR_NOT_SUPPORTED;
  ProcessReader reader(fn_, root_.string());
  std::map<EntityKey, std::vector<ProcessUse>> out;
  EXPECT_FALSE(reader.Read(gpu_, Dev(), &out));
  EXPECT_TRUE(out.empty());
  fake::list_rc = NVML_SUCCESS;
  fake::procs = {{7, kNvmlValueNotAvailableUll, 0xFFFFFFFFu, 0xFFFFFFFFu}};
  ASSERT_TRUE(reader.Read(gpu_, Dev(), &out));
  EXPECT_FALSE(out[(EntityKey{0, -1})][0].has_memory);
  EXPECT_EQ(out[(EntityKey{0, -1})][0].used_bytes, 0u);
}

}  // namespace
}  // namespace gpulet::metrics
