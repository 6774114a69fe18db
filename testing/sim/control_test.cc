#include "sim/control.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "gpu/nvml_api.h"
#include "sim/simulation.h"
#include "sim/telemetry.h"

namespace gpulet::sim {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-sim-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

Fixture Load(const std::string& name) {
  Result<std::string> path = ResolveFixture(name);
  EXPECT_TRUE(path.ok());
  Result<Fixture> f = LoadFixture(*path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return *f;
}

TEST(ControlStateTest, JsonRoundTripKeepsEverything) {
  ControlState s;
  s.gpus[3].temperature_c = 91;
  s.gpus[3].memory_used_mib = 1234;
  s.gpus[3].lost = true;
  s.gpus[5].ecc_double_bit = 2;
  s.gpus[5].compute_mode = NVML_COMPUTEMODE_EXCLUSIVE_PROCESS;
  s.Queue({0, 3, nvmlEventTypeXidCriticalError, 79, kNoInstance, kNoInstance});
  s.Queue({0, 0, nvmlEventTypeXidCriticalError, 13, 2, 0});
  Result<ControlState> back = ControlStateFromJson(ControlStateToJson(s), "mem");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->next_seq, 3u);
  EXPECT_EQ(back->gpus.at(3).temperature_c, 91u);
  EXPECT_EQ(back->gpus.at(3).memory_used_mib, 1234u);
  EXPECT_TRUE(back->gpus.at(3).lost);
  EXPECT_FALSE(back->gpus.at(3).gpu_util.has_value());
  EXPECT_EQ(back->gpus.at(5).ecc_double_bit, 2u);
  EXPECT_EQ(back->gpus.at(5).compute_mode, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
  ASSERT_EQ(back->events.size(), 2u);
  EXPECT_EQ(back->events[0].seq, 1u);
  EXPECT_EQ(back->events[0].data, 79u);
  EXPECT_EQ(back->events[0].gpu_instance, kNoInstance);
  EXPECT_EQ(back->events[1].gpu_instance, 2u);
  EXPECT_EQ(back->events[1].compute_instance, 0u);
}

TEST(ControlStateTest, CorruptFileIsAnErrorNamingIt) {
  Result<ControlState> s = ControlStateFromJson("{\"next_seq\": \"x\"}", "/x/control.json");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kInvalidInput);
  EXPECT_THAT(s.status().message(), HasSubstr("/x/control.json: next_seq"));
}

TEST(ControlStateTest, QueueKeepsOnlyTheNewestEvents) {
  ControlState s;
  for (size_t i = 0; i < ControlState::kMaxEvents + 10; ++i) s.Queue({0, 0, 8, i});
  EXPECT_EQ(s.events.size(), ControlState::kMaxEvents);
  EXPECT_EQ(s.events.front().seq, 11u);
  EXPECT_EQ(s.next_seq, ControlState::kMaxEvents + 11);
}

TEST(ControlFileTest, MissingFileReadsAsEmptyState) {
  ControlFile control(MakeTempDir());
  Result<ControlState> s = control.Read();
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->gpus.empty());
  EXPECT_EQ(s->next_seq, 1u);
}

// Four processes queue events at once; the lock must serialise them so none is lost.
TEST(ControlFileTest, ConcurrentWritersFromSeveralProcessesLoseNothing) {
  const std::string dir = MakeTempDir();
  const Fixture fixture = Load("l4-pcie");
  constexpr int kProcs = 4, kEach = 40;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ControlFile control(dir);
      for (int i = 0; i < kEach; ++i) {
        if (!InjectXid(control, fixture, {static_cast<unsigned>(p), std::nullopt}, 13).ok()) {
          _exit(1);
        }
      }
      _exit(0);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  Result<ControlState> s = ControlFile(dir).Read();
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->events.size(), static_cast<size_t>(kProcs * kEach));
  std::set<uint64_t> seqs;
  for (const auto& e : s->events) seqs.insert(e.seq);
  EXPECT_EQ(seqs.size(), static_cast<size_t>(kProcs * kEach));
  EXPECT_EQ(*seqs.begin(), 1u);
  EXPECT_EQ(*seqs.rbegin(), static_cast<uint64_t>(kProcs * kEach));
  // No temporary files are left behind.
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(".tmp.")));
  }
}

TEST(ControlFileTest, WatchSeesEachReplacement) {
  const std::string dir = MakeTempDir();
  ControlFile control(dir);
  ControlFileWatch watch(control.path());
  EXPECT_TRUE(watch.Changed());  // first call
  EXPECT_FALSE(watch.Changed());
  ASSERT_TRUE(SetLost(control, 0, true).ok());
  EXPECT_TRUE(watch.Changed());
  EXPECT_FALSE(watch.Changed());
  ASSERT_TRUE(SetLost(control, 0, false).ok());
  EXPECT_TRUE(watch.Changed());
}

TEST(VerbTest, FindDeviceByIndexUuidAndMig) {
  const Fixture f = Load("dgx-a100");
  auto by_index = FindDevice(f, "3", std::nullopt);
  ASSERT_TRUE(by_index.ok());
  EXPECT_EQ(by_index->gpu, 3u);
  EXPECT_FALSE(by_index->mig.has_value());
  auto by_uuid = FindDevice(f, f.gpus[5].uuid, std::nullopt);
  ASSERT_TRUE(by_uuid.ok());
  EXPECT_EQ(by_uuid->gpu, 5u);
  auto by_mig_uuid = FindDevice(f, f.gpus[1].mig[4].uuid, std::nullopt);
  ASSERT_TRUE(by_mig_uuid.ok());
  EXPECT_EQ(by_mig_uuid->gpu, 1u);
  EXPECT_EQ(by_mig_uuid->mig, 4u);
  auto by_mig_index = FindDevice(f, "0", 3u);
  ASSERT_TRUE(by_mig_index.ok());
  EXPECT_EQ(by_mig_index->mig, 3u);

  EXPECT_EQ(FindDevice(f, "8", std::nullopt).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(FindDevice(f, "GPU-nope", std::nullopt).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(FindDevice(f, "0", 4u).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(FindDevice(f, "2", 0u).status().code(), ErrorCode::kNotFound);
}

TEST(VerbTest, EccRaisesCountersAndQueuesOneEventPerKind) {
  const Fixture f = Load("dgx-a100");
  ControlFile control(MakeTempDir());
  ASSERT_TRUE(InjectEcc(control, f, {0, 2u}, 3, 1).ok());
  auto s = control.Read();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->gpus.at(0).ecc_single_bit, 3u);
  EXPECT_EQ(s->gpus.at(0).ecc_double_bit, 1u);
  ASSERT_EQ(s->events.size(), 2u);
  EXPECT_EQ(s->events[0].type, nvmlEventTypeSingleBitEccError);
  EXPECT_EQ(s->events[1].type, nvmlEventTypeDoubleBitEccError);
  EXPECT_EQ(s->events[1].gpu_instance, f.gpus[0].mig[2].gi);
  EXPECT_EQ(s->events[1].compute_instance, 0u);
  EXPECT_EQ(InjectEcc(control, f, {0, std::nullopt}, 0, 0).code(), ErrorCode::kUsage);
}

TEST(VerbTest, ResetClearsOneGpuOrEverythingButKeepsSequenceNumbers) {
  const Fixture f = Load("l4-pcie");
  ControlFile control(MakeTempDir());
  GpuOverrides set;
  set.temperature_c = 90;
  ASSERT_TRUE(SetOverrides(control, 1, set).ok());
  ASSERT_TRUE(SetLost(control, 2, true).ok());
  ASSERT_TRUE(InjectXid(control, f, {2, std::nullopt}, 79).ok());
  ASSERT_TRUE(ResetState(control, 1u).ok());
  auto s = control.Read();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->Find(1), nullptr);
  EXPECT_TRUE(s->Find(2)->lost);
  ASSERT_TRUE(ResetState(control, std::nullopt).ok());
  s = control.Read();
  EXPECT_TRUE(s->gpus.empty());
  EXPECT_TRUE(s->events.empty());
  EXPECT_EQ(s->next_seq, 2u);
}

TEST(TelemetryTest, DeterministicBoundedAndEnergyNeverDecreases) {
  const Fixture f = Load("dgx-h100");
  const int64_t t0 = 1767225600000;  // 2026-01-01
  uint64_t last_energy = 0;
  std::set<unsigned> utils;
  for (int64_t t = t0; t < t0 + 3600 * 1000; t += 7919) {
    const Telemetry a = ComputeTelemetry(f, f.gpus[2], t, nullptr);
    const Telemetry b = ComputeTelemetry(f, f.gpus[2], t, nullptr);
    EXPECT_EQ(a.power_mw, b.power_mw);
    EXPECT_EQ(a.energy_mj, b.energy_mj);
    EXPECT_LE(a.gpu_util, 100u);
    EXPECT_LE(a.mem_util, 100u);
    EXPECT_LE(a.memory_used_mib, f.gpus[2].memory_mib);
    EXPECT_GE(a.power_mw, f.gpus[2].idle_power_w * 1000);
    EXPECT_LE(a.power_mw, f.gpus[2].power_limit_w * 1000);
    EXPECT_GE(a.energy_mj, last_energy);
    last_energy = a.energy_mj;
    utils.insert(a.gpu_util);
  }
  EXPECT_GT(utils.size(), 20u) << "telemetry should move over an hour";
  // Different GPUs are out of phase.
  EXPECT_NE(ComputeTelemetry(f, f.gpus[0], t0, nullptr).power_mw,
            ComputeTelemetry(f, f.gpus[1], t0, nullptr).power_mw);
}

TEST(TelemetryTest, OverridesWin) {
  const Fixture f = Load("dgx-h100");
  GpuOverrides o;
  o.temperature_c = 95;
  o.gpu_util = 3;
  o.mem_util = 4;
  o.power_w = 650;
  o.memory_used_mib = 1000;
  o.ecc_double_bit = 2;
  const Telemetry base = ComputeTelemetry(f, f.gpus[0], 1767225600000, nullptr);
  const Telemetry t = ComputeTelemetry(f, f.gpus[0], 1767225600000, &o);
  EXPECT_EQ(t.temperature_c, 95u);
  EXPECT_EQ(t.gpu_util, 3u);
  EXPECT_EQ(t.mem_util, 4u);
  EXPECT_EQ(t.power_mw, 650000u);
  EXPECT_EQ(t.memory_used_mib, 1000u);
  EXPECT_EQ(t.ecc_uncorrected, base.ecc_uncorrected + 2);
}

TEST(SimulationTest, PrepareWritesSystemTreesAndKeepsControlState) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(SetLost(ControlFile(dir), 4, true).ok());
  Result<SimulatedNode> node = PrepareSimulation("dgx-a100", dir);
  ASSERT_TRUE(node.ok()) << node.status().message();
  EXPECT_EQ(std::string(getenv("GPULET_SIM_STATE")), node->state_dir);
  EXPECT_EQ(std::string(getenv("GPULET_SIM_FIXTURE")), node->fixture_path);
  EXPECT_TRUE(fs::exists(node->library_path)) << node->library_path;

  auto read = [](const fs::path& p) {
    std::ifstream in(p);
    std::string line;
    std::getline(in, line);
    return line;
  };
  const fs::path dev = fs::path(node->sysfs_root) / "bus/pci/devices/0000:b7:00.0";
  EXPECT_EQ(read(dev / "numa_node"), "1");
  EXPECT_EQ(read(dev / "local_cpulist"), "64-127,192-255");
  std::ifstream minors(fs::path(node->procfs_root) / "driver/nvidia-caps/mig-minors");
  std::map<std::string, unsigned> m;
  std::string key;
  unsigned minor = 0;
  while (minors >> key >> minor) m[key] = minor;
  EXPECT_EQ(m.at("gpu0/gi2/access"), 21u);
  EXPECT_EQ(m.at("gpu0/gi2/ci0/access"), 22u);
  EXPECT_EQ(m.at("gpu1/gi13/ci0/access"), 3u + 135u + 13u * 9u + 1u);

  auto state = ControlFile(node->state_dir).Read();
  ASSERT_TRUE(state.ok());
  EXPECT_TRUE(state->Find(4)->lost) << "existing control state must survive Prepare";
}

TEST(SimulationTest, PrepareRejectsBadFixtureWithItsLocation) {
  Result<SimulatedNode> node = PrepareSimulation(
      std::string(GPULET_SOURCE_DIR) + "/testing/sim/testdata/bad/dgx-bad.yaml", MakeTempDir());
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), ErrorCode::kInvalidInput);
  EXPECT_THAT(node.status().message(), HasSubstr("dgx-bad.yaml:14: gpus[3].memory_mib"));
}

}  // namespace
}  // namespace gpulet::sim
