// The sampler against a hand-made NVML function table: each fake reads the state below.
#include "metrics/sampler.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace gpulet::metrics {
namespace {

struct FakeGpu {
  unsigned temp = 50;
  unsigned power_mw = 123456;
  unsigned util = 77;
  unsigned mem_util = 33;
  unsigned long long fb_total = 80ull << 30, fb_used = 10ull << 30;
  bool lost = false;
};
// Test-local driver state; tests in this binary run sequentially.
FakeGpu g_gpus[2];
constexpr uintptr_t kMigBase = 100;

unsigned IndexOf(nvmlDevice_t d) {
  auto v = reinterpret_cast<uintptr_t>(d);
  return static_cast<unsigned>(v >= kMigBase ? (v - kMigBase) / 10 : v - 1);
}
bool IsMig(nvmlDevice_t d) { return reinterpret_cast<uintptr_t>(d) >= kMigBase; }

nvmlReturn_t Handle(unsigned i, nvmlDevice_t* d) {
  if (i >= 2) return NVML_ERROR_INVALID_ARGUMENT;
  *d = reinterpret_cast<nvmlDevice_t>(static_cast<uintptr_t>(i + 1));
  return NVML_SUCCESS;
}
nvmlReturn_t MigHandle(nvmlDevice_t parent, unsigned mig, nvmlDevice_t* d) {
  *d = reinterpret_cast<nvmlDevice_t>(kMigBase + IndexOf(parent) * 10 + mig);
  return NVML_SUCCESS;
}
nvmlReturn_t Temp(nvmlDevice_t d, nvmlTemperatureSensors_t, unsigned* t) {
  if (g_gpus[IndexOf(d)].lost) return NVML_ERROR_GPU_IS_LOST;
  *t = g_gpus[IndexOf(d)].temp;
  return NVML_SUCCESS;
}
nvmlReturn_t Power(nvmlDevice_t d, unsigned* mw) {
  if (g_gpus[IndexOf(d)].lost) return NVML_ERROR_GPU_IS_LOST;
  *mw = g_gpus[IndexOf(d)].power_mw;
  return NVML_SUCCESS;
}
nvmlReturn_t Util(nvmlDevice_t d, nvmlUtilization_t* u) {
  if (IsMig(d)) return NVML_ERROR_NOT_SUPPORTED;
  u->gpu = g_gpus[IndexOf(d)].util;
  u->memory = g_gpus[IndexOf(d)].mem_util;
  return NVML_SUCCESS;
}
nvmlReturn_t Mem(nvmlDevice_t d, nvmlMemory_t* m) {
  const FakeGpu& g = g_gpus[IndexOf(d)];
  m->total = IsMig(d) ? (40ull << 30) : g.fb_total;
  m->used = IsMig(d) ? (1ull << 30) : g.fb_used;
  m->free = m->total - m->used;
  return NVML_SUCCESS;
}
nvmlReturn_t NotSupportedPcie(nvmlDevice_t, unsigned*) { return NVML_ERROR_NOT_SUPPORTED; }

gpu::NvmlFunctions FakeTable() {
  gpu::NvmlFunctions fn;
  fn.nvmlDeviceGetHandleByIndex_v2 = Handle;
  fn.nvmlDeviceGetMigDeviceHandleByIndex = MigHandle;
  fn.nvmlDeviceGetTemperature = Temp;
  fn.nvmlDeviceGetPowerUsage = Power;
  fn.nvmlDeviceGetUtilizationRates = Util;
  fn.nvmlDeviceGetMemoryInfo = Mem;
  fn.nvmlDeviceGetPcieReplayCounter = NotSupportedPcie;
  return fn;
}

gpu::Inventory TwoGpuInventory(bool mig_on_second) {
  gpu::Inventory inv;
  inv.driver_version = "550.54.15";
  for (unsigned i = 0; i < 2; ++i) {
    gpu::Gpu g;
    g.index = i;
    g.uuid = "GPU-" + std::to_string(i);
    g.name = "NVIDIA A100-SXM4-80GB";
    g.pci_bus_id = "00000000:0" + std::to_string(i) + ":00.0";
    if (i == 1 && mig_on_second) {
      g.mig_enabled = true;
      for (unsigned m = 0; m < 2; ++m) {
        gpu::MigDevice d;
        d.parent_index = 1;
        d.mig_index = m;
        d.uuid = "MIG-" + std::to_string(m);
        d.profile = "3g.40gb";
        d.gpu_instance_id = m + 1;
        g.mig_devices.push_back(d);
      }
    }
    inv.gpus.push_back(g);
  }
  return inv;
}

std::shared_ptr<const CounterSet> Counters() {
  auto set = ParseCounters(
      "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"
      "DCGM_FI_DEV_POWER_USAGE, gauge, p\n"
      "DCGM_FI_DEV_GPU_UTIL, gauge, u\n"
      "DCGM_FI_DEV_FB_USED, gauge, f\n"
      "DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, r\n"
      "DCGM_FI_DEV_SM_CLOCK, gauge, c\n"
      "DCGM_FI_DEV_XID_ERRORS, gauge, x\n"
      "DCGM_FI_DRIVER_VERSION, label, d\n",
      "t.csv");
  EXPECT_TRUE(set.ok());
  return std::make_shared<const CounterSet>(std::move(set).value());
}

class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_gpus[0] = FakeGpu{};
    g_gpus[1] = FakeGpu{};
    g_gpus[1].temp = 61;
  }
  gpu::NvmlFunctions fn_ = FakeTable();
  XidLog xids_;
};

TEST_F(SamplerTest, ReadsFieldsWithDcgmUnits) {
  Sampler sampler(fn_, TwoGpuInventory(false), "host", &xids_);
  xids_.Record(1, 79);
  Snapshot s = sampler.Sample(Counters());
  ASSERT_EQ(s.entities.size(), 2u);
  const EntitySample& e = s.entities[1];
  EXPECT_EQ(e.key.gpu, 1u);
  EXPECT_EQ(e.values[0]->i, 61);
  EXPECT_TRUE(e.values[1]->is_double);
  EXPECT_DOUBLE_EQ(e.values[1]->d, 123.456);
  EXPECT_EQ(e.values[2]->i, 77);
  EXPECT_EQ(e.values[3]->i, 10 * 1024);  // MiB
  EXPECT_FALSE(e.values[4]);             // not supported by this "driver"
  EXPECT_FALSE(e.values[5]);             // function absent from the table
  EXPECT_EQ(e.values[6]->i, 79);
  EXPECT_EQ(s.entities[0].values[6]->i, 0);
  EXPECT_EQ(e.labels, std::vector<std::string>{"550.54.15"});
  ASSERT_EQ(s.gpus.size(), 2u);
  EXPECT_TRUE(s.gpus[0].up && s.gpus[1].up);
}

TEST_F(SamplerTest, LostGpuIsDroppedAndComesBack) {
  Sampler sampler(fn_, TwoGpuInventory(false), "host", &xids_);
  g_gpus[0].lost = true;
  Snapshot s = sampler.Sample(Counters());
  ASSERT_EQ(s.entities.size(), 1u);
  EXPECT_EQ(s.entities[0].key.gpu, 1u);
  EXPECT_FALSE(s.gpus[0].up);
  EXPECT_NE(s.gpus[0].reason.find("NVML_ERROR_GPU_IS_LOST"), std::string::npos);
  EXPECT_TRUE(s.gpus[1].up);
  g_gpus[0].lost = false;
  s = sampler.Sample(Counters());
  EXPECT_EQ(s.entities.size(), 2u);
  EXPECT_TRUE(s.gpus[0].up);
}

TEST_F(SamplerTest, MigInstancesGetParentAndInstanceValues) {
  Sampler sampler(fn_, TwoGpuInventory(true), "host", &xids_);
  Snapshot s = sampler.Sample(Counters());
  ASSERT_EQ(s.entities.size(), 3u);
  const EntitySample& mig = s.entities[1];
  EXPECT_EQ(mig.key.gpu, 1u);
  EXPECT_EQ(mig.key.gpu_instance_id, 1);
  EXPECT_EQ(mig.mig_profile, "3g.40gb");
  EXPECT_EQ(mig.values[0]->i, 61);      // temperature: the parent's
  EXPECT_FALSE(mig.values[2]);          // utilisation: none per instance
  EXPECT_EQ(mig.values[3]->i, 1024);    // framebuffer: the instance's
  EXPECT_EQ(s.entities[2].key.gpu_instance_id, 2);
}

}  // namespace
}  // namespace gpulet::metrics
