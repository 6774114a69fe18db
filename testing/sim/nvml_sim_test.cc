// The simulated driver, loaded the way gpulet loads a driver: dlopen + dlsym.
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "gpu/nvml_api.h"
#include "sim/simulation.h"

namespace gpulet::sim {
namespace {

namespace fs = std::filesystem;

struct Api {
#define GPULET_SIM_MEMBER(name, ret, params) ret(*name) params = nullptr;
  GPULET_NVML_ALL_FUNCTIONS(GPULET_SIM_MEMBER)
#undef GPULET_SIM_MEMBER
};

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-nvml-sim-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

// One simulated node in its own state directory, with the library dlopened from the build dir.
class SimDriverTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (lib_ != nullptr) dlclose(lib_);
  }

  // Prepares `fixture`, loads the library and resolves every function (failing on a missing one).
  void Open(const std::string& fixture) {
    Result<SimulatedNode> node = PrepareSimulation(fixture, MakeTempDir());
    ASSERT_TRUE(node.ok()) << node.status().message();
    node_ = *node;
    Result<std::string> path = ResolveFixture(fixture);
    ASSERT_TRUE(path.ok());
    Result<Fixture> f = LoadFixture(*path);
    ASSERT_TRUE(f.ok());
    fixture_ = *f;
    control_ = std::make_unique<ControlFile>(node_.state_dir);
    LoadLibrary(node_.library_path);
  }

  void LoadLibrary(const std::string& path) {
    lib_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib_, nullptr) << dlerror();
#define GPULET_SIM_RESOLVE(name, ret, params)                      \
  api_.name = reinterpret_cast<ret(*) params>(dlsym(lib_, #name)); \
  ASSERT_NE(api_.name, nullptr) << #name;
    GPULET_NVML_ALL_FUNCTIONS(GPULET_SIM_RESOLVE)
#undef GPULET_SIM_RESOLVE
  }

  void OpenAndInit(const std::string& fixture) {
    Open(fixture);
    ASSERT_EQ(api_.nvmlInit_v2(), NVML_SUCCESS);
  }

  nvmlDevice_t Handle(unsigned index) {
    nvmlDevice_t d = nullptr;
    EXPECT_EQ(api_.nvmlDeviceGetHandleByIndex_v2(index, &d), NVML_SUCCESS);
    return d;
  }

  std::string Uuid(nvmlDevice_t d) {
    char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    EXPECT_EQ(api_.nvmlDeviceGetUUID(d, buf, sizeof buf), NVML_SUCCESS);
    return buf;
  }

  // Runs `child` in a forked process: the "other process" that changes the node.
  void InOtherProcess(const std::function<bool()>& child) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(child() ? 0 : 1);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }

  void* lib_ = nullptr;
  Api api_;
  SimulatedNode node_;
  Fixture fixture_;
  std::unique_ptr<ControlFile> control_;
};

TEST_F(SimDriverTest, ExportsOnlyNvmlFunctions) {
  Open("l4-pcie");
  EXPECT_EQ(
      dlsym(lib_,
            "_ZN6gpulet3sim11LoadFixtureERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"),
      nullptr);
  std::ifstream in("/proc/self/maps");  // the library is mapped from the build dir
  std::string maps((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(maps, ::testing::HasSubstr("libnvidia-ml.so.1"));
}

TEST_F(SimDriverTest, MissingSymbolVariantLacksOnlyMemoryInfo) {
  void* lib = dlopen((fs::path(GPULET_BUILD_DIR) / "sim/missing-symbol/libnvidia-ml.so.1").c_str(),
                     RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  EXPECT_EQ(dlsym(lib, "nvmlDeviceGetMemoryInfo"), nullptr);
  EXPECT_NE(dlsym(lib, "nvmlInit_v2"), nullptr);
  EXPECT_NE(dlsym(lib, "nvmlDeviceGetName"), nullptr);
  dlclose(lib);
}

TEST_F(SimDriverTest, CallsBeforeInitAndAfterLastShutdownAreUninitialized) {
  Open("l4-pcie");
  unsigned count = 0;
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
  EXPECT_EQ(api_.nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
  EXPECT_STREQ(api_.nvmlErrorString(NVML_ERROR_GPU_IS_LOST), "GPU is lost");
  ASSERT_EQ(api_.nvmlInit_v2(), NVML_SUCCESS);
  ASSERT_EQ(api_.nvmlInit_v2(), NVML_SUCCESS);  // reference counted
  EXPECT_EQ(api_.nvmlShutdown(), NVML_SUCCESS);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), NVML_SUCCESS) << "still one reference";
  EXPECT_EQ(count, 4u);
  EXPECT_EQ(api_.nvmlShutdown(), NVML_SUCCESS);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
  EXPECT_EQ(api_.nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
}

TEST_F(SimDriverTest, InitFailsWithTheFixturesInitError) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/no-driver.yaml";
  std::ofstream(path) << "driver_version: 550.54.15\ncuda_version: 12040\n"
                         "init_error: DRIVER_NOT_LOADED\ngpus: []\n";
  ASSERT_TRUE(PrepareSimulation(path, dir + "/state").ok());
  LoadLibrary(std::string(GPULET_BUILD_DIR) + "/sim/libnvidia-ml.so.1");
  EXPECT_EQ(api_.nvmlInit_v2(), NVML_ERROR_DRIVER_NOT_LOADED);
  unsigned count = 0;
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
}

TEST_F(SimDriverTest, InitFailsWithUnknownWhenTheFixtureIsMissingOrInvalid) {
  LoadLibrary(std::string(GPULET_BUILD_DIR) + "/sim/libnvidia-ml.so.1");
  setenv("GPULET_SIM_STATE", MakeTempDir().c_str(), 1);
  setenv("GPULET_SIM_FIXTURE", "/nonexistent/fixture.yaml", 1);
  EXPECT_EQ(api_.nvmlInit_v2(), NVML_ERROR_UNKNOWN);
  setenv("GPULET_SIM_FIXTURE",
         (std::string(GPULET_SOURCE_DIR) + "/testing/sim/testdata/bad/dgx-bad.yaml").c_str(), 1);
  EXPECT_EQ(api_.nvmlInit_v2(), NVML_ERROR_UNKNOWN);
  unsetenv("GPULET_SIM_FIXTURE");
  EXPECT_EQ(api_.nvmlInit_v2(), NVML_ERROR_UNKNOWN);
}

// The driver library reads the parsed copy PrepareSimulation writes (fixture_json.h); without a
// current one it parses the YAML through its helper library, and keeps the copy for the next
// process. A copy of another text is not used.
TEST_F(SimDriverTest, WithoutACurrentParsedCopyTheYamlIsParsedByTheHelper) {
  const std::string dir = MakeTempDir();
  const std::string yaml = dir + "/two.yaml";
  auto write_fixture = [&](unsigned gpus) {
    std::ofstream out(yaml, std::ios::trunc);
    out << "driver_version: 550.54.15\ncuda_version: 12040\ncount: " << gpus
        << "\ndefaults: {name: NVIDIA L4, memory_mib: 23034, compute_capability: \"8.9\", "
           "architecture: ada, sm_count: 58}\n";
  };
  write_fixture(2);
  const std::string state = dir + "/state";
  fs::create_directories(state);
  LoadLibrary(std::string(GPULET_BUILD_DIR) + "/sim/libnvidia-ml.so.1");
  setenv("GPULET_SIM_FIXTURE", yaml.c_str(), 1);
  setenv("GPULET_SIM_STATE", state.c_str(), 1);
  ASSERT_FALSE(fs::exists(state + "/fixture.json"));
  ASSERT_EQ(api_.nvmlInit_v2(), NVML_SUCCESS);
  unsigned count = 0;
  ASSERT_EQ(api_.nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
  EXPECT_EQ(count, 2u);
  ASSERT_EQ(api_.nvmlShutdown(), NVML_SUCCESS);
  EXPECT_TRUE(fs::exists(state + "/fixture.json")) << "the helper's answer was not kept";

  // The YAML changes: the kept copy is stale and the driver follows the file.
  write_fixture(3);
  ASSERT_EQ(api_.nvmlInit_v2(), NVML_SUCCESS);
  ASSERT_EQ(api_.nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
  EXPECT_EQ(count, 3u);
  ASSERT_EQ(api_.nvmlShutdown(), NVML_SUCCESS);
  unsetenv("GPULET_SIM_FIXTURE");
  unsetenv("GPULET_SIM_STATE");
}

TEST_F(SimDriverTest, DgxH100ReportsEightGpusAndNv18BetweenEveryPair) {
  OpenAndInit("dgx-h100");
  char version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
  ASSERT_EQ(api_.nvmlSystemGetDriverVersion(version, sizeof version), NVML_SUCCESS);
  EXPECT_STREQ(version, "550.54.15");
  EXPECT_EQ(api_.nvmlSystemGetDriverVersion(version, 5), NVML_ERROR_INSUFFICIENT_SIZE);
  int cuda = 0;
  ASSERT_EQ(api_.nvmlSystemGetCudaDriverVersion_v2(&cuda), NVML_SUCCESS);
  EXPECT_EQ(cuda, 12040);
  unsigned count = 0;
  ASSERT_EQ(api_.nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
  ASSERT_EQ(count, 8u);
  EXPECT_EQ(api_.nvmlDeviceGetCount_v2(nullptr), NVML_ERROR_INVALID_ARGUMENT);
  nvmlDevice_t bad = nullptr;
  EXPECT_EQ(api_.nvmlDeviceGetHandleByIndex_v2(8, &bad), NVML_ERROR_INVALID_ARGUMENT);

  std::map<std::string, unsigned> index_by_bus;
  std::vector<nvmlDevice_t> handles;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t d = Handle(i);
    handles.push_back(d);
    EXPECT_EQ(Uuid(d), fixture_.gpus[i].uuid);
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    ASSERT_EQ(api_.nvmlDeviceGetName(d, name, sizeof name), NVML_SUCCESS);
    EXPECT_STREQ(name, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(api_.nvmlDeviceGetName(d, name, 4), NVML_ERROR_INSUFFICIENT_SIZE);
    EXPECT_EQ(api_.nvmlDeviceGetName(d, nullptr, 96), NVML_ERROR_INVALID_ARGUMENT);
    nvmlMemory_t mem{};
    ASSERT_EQ(api_.nvmlDeviceGetMemoryInfo(d, &mem), NVML_SUCCESS);
    EXPECT_EQ(mem.total, 81559ULL * 1024 * 1024);
    EXPECT_EQ(mem.used + mem.free, mem.total);
    nvmlPciInfo_t pci{};
    ASSERT_EQ(api_.nvmlDeviceGetPciInfo_v3(d, &pci), NVML_SUCCESS);
    EXPECT_EQ(std::string(pci.busId), fixture_.gpus[i].NvmlBusId());
    EXPECT_EQ(pci.pciDeviceId, 0x233010DEu);
    index_by_bus[pci.busId] = i;
    unsigned minor = 99;
    ASSERT_EQ(api_.nvmlDeviceGetMinorNumber(d, &minor), NVML_SUCCESS);
    EXPECT_EQ(minor, i);
    int major = 0, cc_minor = 0;
    ASSERT_EQ(api_.nvmlDeviceGetCudaComputeCapability(d, &major, &cc_minor), NVML_SUCCESS);
    EXPECT_EQ(major * 10 + cc_minor, 90);
    nvmlDeviceArchitecture_t arch = 0;
    ASSERT_EQ(api_.nvmlDeviceGetArchitecture(d, &arch), NVML_SUCCESS);
    EXPECT_EQ(arch, NVML_DEVICE_ARCH_HOPPER);
    unsigned current = 9, pending = 9;
    ASSERT_EQ(api_.nvmlDeviceGetMigMode(d, &current, &pending), NVML_SUCCESS);
    EXPECT_EQ(current, NVML_DEVICE_MIG_DISABLE);
  }
  EXPECT_EQ(handles[0], Handle(0)) << "handles are stable";
  EXPECT_EQ(index_by_bus.count("00000000:18:00.0"), 1u);

  // On an NVSwitch system every one of a GPU's 18 links ends at a switch, not at a peer GPU.
  for (unsigned i = 0; i < count; ++i) {
    unsigned to_switch = 0;
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
      nvmlEnableState_t active = NVML_FEATURE_DISABLED;
      ASSERT_EQ(api_.nvmlDeviceGetNvLinkState(handles[i], link, &active), NVML_SUCCESS);
      ASSERT_EQ(active, NVML_FEATURE_ENABLED);
      nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
      ASSERT_EQ(api_.nvmlDeviceGetNvLinkRemoteDeviceType(handles[i], link, &type), NVML_SUCCESS);
      nvmlPciInfo_t remote{};
      ASSERT_EQ(api_.nvmlDeviceGetNvLinkRemotePciInfo_v2(handles[i], link, &remote), NVML_SUCCESS);
      EXPECT_EQ(index_by_bus.count(remote.busId), 0u) << remote.busId << " is a GPU";
      if (type == NVML_NVLINK_DEVICE_TYPE_SWITCH) ++to_switch;
    }
    EXPECT_EQ(to_switch, 18u);
    nvmlEnableState_t active{};
    EXPECT_EQ(api_.nvmlDeviceGetNvLinkState(handles[i], NVML_NVLINK_MAX_LINKS, &active),
              NVML_ERROR_INVALID_ARGUMENT);
  }

  nvmlGpuTopologyLevel_t level{};
  ASSERT_EQ(api_.nvmlDeviceGetTopologyCommonAncestor(handles[0], handles[3], &level), NVML_SUCCESS);
  EXPECT_EQ(level, NVML_TOPOLOGY_NODE);
  ASSERT_EQ(api_.nvmlDeviceGetTopologyCommonAncestor(handles[0], handles[4], &level), NVML_SUCCESS);
  EXPECT_EQ(level, NVML_TOPOLOGY_SYSTEM);
}

// Direct GPU-to-GPU links: link i ends at a peer GPU; links past the GPU's count are disabled.
TEST_F(SimDriverTest, DirectNvlinksLeadToPeerGpus) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/pairs.yaml";
  std::ofstream(path) << "driver_version: 1\ncuda_version: 12040\n"
                         "defaults: {name: X, memory_mib: 1, compute_capability: \"8.0\", "
                         "architecture: ampere}\n"
                         "gpus: [{bus_id: \"0000:01:00.0\"}, {bus_id: \"0000:02:00.0\"}, "
                         "{bus_id: \"0000:03:00.0\"}]\n"
                         "nvlink: {pairs: [[0, 1, 4], [0, 2, 2]]}\n";
  ASSERT_TRUE(PrepareSimulation(path, dir + "/state").ok());
  LoadLibrary(std::string(GPULET_BUILD_DIR) + "/sim/libnvidia-ml.so.1");
  ASSERT_EQ(api_.nvmlInit_v2(), NVML_SUCCESS);
  std::map<std::string, unsigned> links_to;
  for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
    nvmlEnableState_t active{};
    ASSERT_EQ(api_.nvmlDeviceGetNvLinkState(Handle(0), link, &active), NVML_SUCCESS);
    if (active != NVML_FEATURE_ENABLED) continue;
    nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    ASSERT_EQ(api_.nvmlDeviceGetNvLinkRemoteDeviceType(Handle(0), link, &type), NVML_SUCCESS);
    EXPECT_EQ(type, NVML_NVLINK_DEVICE_TYPE_GPU);
    nvmlPciInfo_t remote{};
    ASSERT_EQ(api_.nvmlDeviceGetNvLinkRemotePciInfo_v2(Handle(0), link, &remote), NVML_SUCCESS);
    links_to[remote.busId]++;
  }
  EXPECT_EQ(links_to,
            (std::map<std::string, unsigned>{{"00000000:02:00.0", 4}, {"00000000:03:00.0", 2}}));
  nvmlEnableState_t active{};
  ASSERT_EQ(api_.nvmlDeviceGetNvLinkState(Handle(1), 4, &active), NVML_SUCCESS);
  EXPECT_EQ(active, NVML_FEATURE_DISABLED);
  EXPECT_EQ(api_.nvmlDeviceGetNvLinkState(Handle(1), NVML_NVLINK_MAX_LINKS, &active),
            NVML_ERROR_INVALID_ARGUMENT);
}

TEST_F(SimDriverTest, DgxA100ExposesMigDevicesWithIdsAndAttributes) {
  OpenAndInit("dgx-a100");
  nvmlDevice_t gpu0 = Handle(0);
  unsigned current = 0, pending = 0, max = 0;
  ASSERT_EQ(api_.nvmlDeviceGetMigMode(gpu0, &current, &pending), NVML_SUCCESS);
  EXPECT_EQ(current, NVML_DEVICE_MIG_ENABLE);
  ASSERT_EQ(api_.nvmlDeviceGetMaxMigDeviceCount(gpu0, &max), NVML_SUCCESS);
  EXPECT_EQ(max, 7u);

  struct Want {
    unsigned gi, slices, sms;
    unsigned long long mb;
    const char* profile;
  };
  const Want want[] = {{2, 3, 42, 19968, "3g.20gb"},
                       {3, 2, 28, 9856, "2g.10gb"},
                       {9, 1, 14, 4864, "1g.5gb"},
                       {10, 1, 14, 4864, "1g.5gb"}};
  std::set<std::string> uuids;
  for (unsigned i = 0; i < max; ++i) {
    nvmlDevice_t mig = nullptr;
    nvmlReturn_t rc = api_.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, i, &mig);
    if (i >= 4) {
      EXPECT_EQ(rc, NVML_ERROR_NOT_FOUND) << i;
      continue;
    }
    ASSERT_EQ(rc, NVML_SUCCESS);
    const std::string uuid = Uuid(mig);
    EXPECT_EQ(uuid.rfind("MIG-", 0), 0u) << uuid;
    uuids.insert(uuid);
    unsigned gi = 99, ci = 99;
    ASSERT_EQ(api_.nvmlDeviceGetGpuInstanceId(mig, &gi), NVML_SUCCESS);
    ASSERT_EQ(api_.nvmlDeviceGetComputeInstanceId(mig, &ci), NVML_SUCCESS);
    EXPECT_EQ(gi, want[i].gi);
    EXPECT_EQ(ci, 0u);
    nvmlDeviceAttributes_t attrs{};
    ASSERT_EQ(api_.nvmlDeviceGetAttributes_v2(mig, &attrs), NVML_SUCCESS);
    EXPECT_EQ(attrs.gpuInstanceSliceCount, want[i].slices);
    EXPECT_EQ(attrs.computeInstanceSliceCount, want[i].slices);
    EXPECT_EQ(attrs.multiprocessorCount, want[i].sms);
    EXPECT_EQ(attrs.memorySizeMB, want[i].mb);
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    ASSERT_EQ(api_.nvmlDeviceGetName(mig, name, sizeof name), NVML_SUCCESS);
    EXPECT_EQ(std::string(name), std::string("NVIDIA A100-SXM4-40GB MIG ") + want[i].profile);
    nvmlMemory_t mem{};
    ASSERT_EQ(api_.nvmlDeviceGetMemoryInfo(mig, &mem), NVML_SUCCESS);
    EXPECT_EQ(mem.total, want[i].mb * 1024 * 1024);
    // MIG handles are not physical GPUs.
    unsigned minor = 0;
    EXPECT_EQ(api_.nvmlDeviceGetMinorNumber(mig, &minor), NVML_ERROR_NOT_SUPPORTED);
  }
  EXPECT_EQ(uuids.size(), 4u);
  unsigned gi = 0;
  EXPECT_EQ(api_.nvmlDeviceGetGpuInstanceId(gpu0, &gi), NVML_ERROR_NOT_SUPPORTED);
  nvmlDevice_t none = nullptr;
  EXPECT_EQ(api_.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 7, &none), NVML_ERROR_INVALID_ARGUMENT);

  unsigned seven = 0;
  for (unsigned i = 0; i < 7; ++i) {
    nvmlDevice_t mig = nullptr;
    if (api_.nvmlDeviceGetMigDeviceHandleByIndex(Handle(1), i, &mig) == NVML_SUCCESS) ++seven;
  }
  EXPECT_EQ(seven, 7u);
  ASSERT_EQ(api_.nvmlDeviceGetMigMode(Handle(2), &current, &pending), NVML_SUCCESS);
  EXPECT_EQ(current, NVML_DEVICE_MIG_DISABLE);
  EXPECT_EQ(api_.nvmlDeviceGetMigDeviceHandleByIndex(Handle(2), 0, &none), NVML_ERROR_NOT_FOUND);

  nvmlGpuTopologyLevel_t level{};
  ASSERT_EQ(api_.nvmlDeviceGetTopologyCommonAncestor(Handle(0), Handle(1), &level), NVML_SUCCESS);
  EXPECT_EQ(level, NVML_TOPOLOGY_MULTIPLE);
}

TEST_F(SimDriverTest, PcieOnlyNodeHasNoNvlinkAndNoMig) {
  OpenAndInit("l4-pcie");
  nvmlDevice_t d = Handle(0);
  unsigned current = 0, pending = 0;
  EXPECT_EQ(api_.nvmlDeviceGetMigMode(d, &current, &pending), NVML_ERROR_NOT_SUPPORTED);
  nvmlEnableState_t active{};
  EXPECT_EQ(api_.nvmlDeviceGetNvLinkState(d, 0, &active), NVML_ERROR_NOT_SUPPORTED);
  nvmlGpuTopologyLevel_t level{};
  ASSERT_EQ(api_.nvmlDeviceGetTopologyCommonAncestor(d, Handle(1), &level), NVML_SUCCESS);
  EXPECT_EQ(level, NVML_TOPOLOGY_MULTIPLE);
  ASSERT_EQ(api_.nvmlDeviceGetTopologyCommonAncestor(d, Handle(2), &level), NVML_SUCCESS);
  EXPECT_EQ(level, NVML_TOPOLOGY_SYSTEM);
  nvmlDeviceArchitecture_t arch = 0;
  ASSERT_EQ(api_.nvmlDeviceGetArchitecture(d, &arch), NVML_SUCCESS);
  EXPECT_EQ(arch, NVML_DEVICE_ARCH_ADA);
}

TEST_F(SimDriverTest, TelemetryIsLiveAndWithinLimits) {
  OpenAndInit("dgx-h100");
  nvmlDevice_t d = Handle(0);
  unsigned temp = 0, power = 0, sm = 0, mem_clock = 0, replays = 0;
  nvmlUtilization_t util{};
  unsigned long long e1 = 0, e2 = 0, ecc = 0;
  ASSERT_EQ(api_.nvmlDeviceGetTemperature(d, NVML_TEMPERATURE_GPU, &temp), NVML_SUCCESS);
  EXPECT_GT(temp, 20u);
  EXPECT_LT(temp, 100u);
  ASSERT_EQ(api_.nvmlDeviceGetUtilizationRates(d, &util), NVML_SUCCESS);
  EXPECT_LE(util.gpu, 100u);
  ASSERT_EQ(api_.nvmlDeviceGetPowerUsage(d, &power), NVML_SUCCESS);
  EXPECT_GE(power, 72000u);
  EXPECT_LE(power, 700000u);
  ASSERT_EQ(api_.nvmlDeviceGetTotalEnergyConsumption(d, &e1), NVML_SUCCESS);
  ASSERT_EQ(api_.nvmlDeviceGetTotalEnergyConsumption(d, &e2), NVML_SUCCESS);
  EXPECT_GE(e2, e1);
  ASSERT_EQ(api_.nvmlDeviceGetClockInfo(d, NVML_CLOCK_SM, &sm), NVML_SUCCESS);
  EXPECT_LE(sm, 1980u);
  ASSERT_EQ(api_.nvmlDeviceGetClockInfo(d, NVML_CLOCK_MEM, &mem_clock), NVML_SUCCESS);
  EXPECT_EQ(mem_clock, 2619u);
  ASSERT_EQ(api_.nvmlDeviceGetPcieReplayCounter(d, &replays), NVML_SUCCESS);
  ASSERT_EQ(api_.nvmlDeviceGetTotalEccErrors(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                             NVML_VOLATILE_ECC, &ecc),
            NVML_SUCCESS);
  EXPECT_EQ(ecc, 0u);
  EXPECT_EQ(api_.nvmlDeviceGetTemperature(d, NVML_TEMPERATURE_GPU, nullptr),
            NVML_ERROR_INVALID_ARGUMENT);
}

TEST_F(SimDriverTest, ChangesFromAnotherProcessReachTheRunningLibrary) {
  OpenAndInit("dgx-h100");
  nvmlDevice_t d = Handle(3);
  InOtherProcess([&] {
    GpuOverrides set;
    set.temperature_c = 91;
    set.gpu_util = 7;
    set.memory_used_mib = 4096;
    return SetOverrides(*control_, 3, set).ok() &&
           InjectEcc(*control_, fixture_, {3, std::nullopt}, 5, 2).ok();
  });
  unsigned temp = 0;
  ASSERT_EQ(api_.nvmlDeviceGetTemperature(d, NVML_TEMPERATURE_GPU, &temp), NVML_SUCCESS);
  EXPECT_EQ(temp, 91u);
  nvmlUtilization_t util{};
  ASSERT_EQ(api_.nvmlDeviceGetUtilizationRates(d, &util), NVML_SUCCESS);
  EXPECT_EQ(util.gpu, 7u);
  nvmlMemory_t mem{};
  ASSERT_EQ(api_.nvmlDeviceGetMemoryInfo(d, &mem), NVML_SUCCESS);
  EXPECT_EQ(mem.used, 4096ULL * 1024 * 1024);
  unsigned long long dbe = 0;
  ASSERT_EQ(api_.nvmlDeviceGetTotalEccErrors(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                             NVML_AGGREGATE_ECC, &dbe),
            NVML_SUCCESS);
  EXPECT_EQ(dbe, 2u);
  // Other GPUs are untouched.
  ASSERT_EQ(api_.nvmlDeviceGetTotalEccErrors(Handle(2), NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                             NVML_AGGREGATE_ECC, &dbe),
            NVML_SUCCESS);
  EXPECT_EQ(dbe, 0u);
}

// Processes set through the control state (as `gpulet sim` or a test does) reach the running
// library, with NVML's two-call protocol and its NOT_FOUND for "no newer sample".
TEST_F(SimDriverTest, ComputeProcessesAndTheirUtilisation) {
  OpenAndInit("dgx-h100");
  nvmlDevice_t d = Handle(2);
  unsigned n = 0;
  ASSERT_EQ(api_.nvmlDeviceGetComputeRunningProcesses_v3(d, &n, nullptr), NVML_SUCCESS);
  EXPECT_EQ(n, 0u);
  ASSERT_EQ(api_.nvmlDeviceGetProcessUtilization(d, nullptr, &n, 0), NVML_ERROR_NOT_FOUND);

  ASSERT_TRUE(control_
                  ->Update([](ControlState& s) {
                    s.processes[2] = {{4242, 1536, 30, 12}, {4343, 512, 55, 3}};
                  })
                  .ok());
  n = 0;
  ASSERT_EQ(api_.nvmlDeviceGetComputeRunningProcesses_v3(d, &n, nullptr),
            NVML_ERROR_INSUFFICIENT_SIZE);
  ASSERT_EQ(n, 2u);
  std::vector<nvmlProcessInfo_t> infos(n);
  ASSERT_EQ(api_.nvmlDeviceGetComputeRunningProcesses_v3(d, &n, infos.data()), NVML_SUCCESS);
  EXPECT_EQ(infos[0].pid, 4242u);
  EXPECT_EQ(infos[0].usedGpuMemory, 1536ULL << 20);
  EXPECT_EQ(infos[0].gpuInstanceId, 0xFFFFFFFFu);
  EXPECT_EQ(infos[1].pid, 4343u);

  n = 0;
  ASSERT_EQ(api_.nvmlDeviceGetProcessUtilization(d, nullptr, &n, 0), NVML_ERROR_INSUFFICIENT_SIZE);
  ASSERT_EQ(n, 2u);
  std::vector<nvmlProcessUtilizationSample_t> samples(n);
  ASSERT_EQ(api_.nvmlDeviceGetProcessUtilization(d, samples.data(), &n, 0), NVML_SUCCESS);
  EXPECT_EQ(samples[1].pid, 4343u);
  EXPECT_EQ(samples[1].smUtil, 55u);
  EXPECT_EQ(samples[1].memUtil, 3u);
  EXPECT_GT(samples[1].timeStamp, 0u);
  // Nothing newer than a timestamp from the future.
  ASSERT_EQ(api_.nvmlDeviceGetProcessUtilization(d, samples.data(), &n, ~0ULL >> 1),
            NVML_ERROR_NOT_FOUND);
  // Other GPUs keep the fixture's (none).
  ASSERT_EQ(api_.nvmlDeviceGetComputeRunningProcesses_v3(Handle(1), &n, nullptr), NVML_SUCCESS);
  EXPECT_EQ(n, 0u);
}

TEST_F(SimDriverTest, MigDevicesListTheProcessesOfTheirGpuInstance) {
  OpenAndInit("dgx-a100");
  nvmlDevice_t gpu0 = Handle(0);
  ASSERT_TRUE(control_
                  ->Update([](ControlState& s) {
                    s.processes[0] = {{10, 100, 0, 0, 2, 0}, {11, 200, 0, 0, 3, 0}};
                  })
                  .ok());
  unsigned n = 8;
  std::vector<nvmlProcessInfo_t> infos(n);
  ASSERT_EQ(api_.nvmlDeviceGetComputeRunningProcesses_v3(gpu0, &n, infos.data()), NVML_SUCCESS);
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(infos[0].gpuInstanceId, 2u);
  EXPECT_EQ(infos[1].gpuInstanceId, 3u);
  nvmlDevice_t mig = nullptr;
  ASSERT_EQ(api_.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 1, &mig), NVML_SUCCESS);  // gi 3
  n = 8;
  ASSERT_EQ(api_.nvmlDeviceGetComputeRunningProcesses_v3(mig, &n, infos.data()), NVML_SUCCESS);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(infos[0].pid, 11u);
  EXPECT_EQ(api_.nvmlDeviceGetProcessUtilization(mig, nullptr, &n, 0), NVML_ERROR_NOT_SUPPORTED);
}

TEST_F(SimDriverTest, LostGpuFailsEveryCallUntilRestored) {
  OpenAndInit("dgx-a100");
  nvmlDevice_t d = Handle(0);
  nvmlDevice_t mig = nullptr;
  ASSERT_EQ(api_.nvmlDeviceGetMigDeviceHandleByIndex(d, 0, &mig), NVML_SUCCESS);
  InOtherProcess([&] { return SetLost(*control_, 0, true).ok(); });
  nvmlDevice_t again = nullptr;
  EXPECT_EQ(api_.nvmlDeviceGetHandleByIndex_v2(0, &again), NVML_ERROR_GPU_IS_LOST);
  char buf[96];
  EXPECT_EQ(api_.nvmlDeviceGetUUID(d, buf, sizeof buf), NVML_ERROR_GPU_IS_LOST);
  EXPECT_EQ(api_.nvmlDeviceGetUUID(mig, buf, sizeof buf), NVML_ERROR_GPU_IS_LOST);
  nvmlMemory_t mem{};
  EXPECT_EQ(api_.nvmlDeviceGetMemoryInfo(d, &mem), NVML_ERROR_GPU_IS_LOST);
  nvmlGpuTopologyLevel_t level{};
  EXPECT_EQ(api_.nvmlDeviceGetTopologyCommonAncestor(Handle(1), d, &level), NVML_ERROR_GPU_IS_LOST);
  EXPECT_EQ(api_.nvmlDeviceGetMemoryInfo(Handle(1), &mem), NVML_SUCCESS) << "others still work";

  InOtherProcess([&] { return SetLost(*control_, 0, false).ok(); });
  EXPECT_EQ(api_.nvmlDeviceGetHandleByIndex_v2(0, &again), NVML_SUCCESS);
  EXPECT_EQ(again, d);
  EXPECT_EQ(api_.nvmlDeviceGetMemoryInfo(d, &mem), NVML_SUCCESS);
}

TEST_F(SimDriverTest, EventWaitWakesOnXidQueuedByAnotherProcess) {
  OpenAndInit("dgx-h100");
  nvmlDevice_t d = Handle(5);
  nvmlEventSet_t set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), NVML_SUCCESS);
  ASSERT_EQ(api_.nvmlDeviceRegisterEvents(d, nvmlEventTypeXidCriticalError, set), NVML_SUCCESS);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    usleep(100 * 1000);  // let the parent block in the wait first
    _exit(InjectXid(*control_, fixture_, {5, std::nullopt}, 79).ok() ? 0 : 1);
  }
  nvmlEventData_t data{};
  // A generous bound: the wait must return as soon as the event lands, long before this.
  EXPECT_EQ(api_.nvmlEventSetWait_v2(set, &data, 60000), NVML_SUCCESS);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_EQ(data.device, d);
  EXPECT_EQ(data.eventType, nvmlEventTypeXidCriticalError);
  EXPECT_EQ(data.eventData, 79u);
  EXPECT_EQ(data.gpuInstanceId, kNoInstance);
  // XID 79 is an event only; losing the GPU is a separate `lose`.
  EXPECT_EQ(Uuid(d), fixture_.gpus[5].uuid);
  EXPECT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), NVML_ERROR_TIMEOUT) << "consumed once";
  EXPECT_EQ(api_.nvmlEventSetFree(set), NVML_SUCCESS);
}

TEST_F(SimDriverTest, EventWaitTimesOutWhenNothingArrives) {
  OpenAndInit("l4-pcie");
  nvmlEventSet_t set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), NVML_SUCCESS);
  ASSERT_EQ(api_.nvmlDeviceRegisterEvents(Handle(0), nvmlEventTypeXidCriticalError, set),
            NVML_SUCCESS);
  nvmlEventData_t data{};
  EXPECT_EQ(api_.nvmlEventSetWait_v2(set, &data, 50), NVML_ERROR_TIMEOUT);
  EXPECT_EQ(api_.nvmlEventSetFree(set), NVML_SUCCESS);
}

TEST_F(SimDriverTest, EventSetSeesOnlyLaterEventsForItsDevicesAndTypes) {
  OpenAndInit("dgx-a100");
  ASSERT_TRUE(InjectXid(*control_, fixture_, {0, std::nullopt}, 13).ok());  // before the set
  nvmlEventSet_t set = nullptr;
  ASSERT_EQ(api_.nvmlEventSetCreate(&set), NVML_SUCCESS);
  ASSERT_EQ(api_.nvmlDeviceRegisterEvents(
                Handle(0), nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError, set),
            NVML_SUCCESS);
  EXPECT_EQ(api_.nvmlDeviceRegisterEvents(Handle(0), 1ULL << 40, set), NVML_ERROR_NOT_SUPPORTED);
  ASSERT_TRUE(InjectXid(*control_, fixture_, {1, std::nullopt}, 48).ok());    // unregistered GPU
  ASSERT_TRUE(InjectEcc(*control_, fixture_, {0, std::nullopt}, 1, 0).ok());  // unregistered type
  ASSERT_TRUE(InjectXid(*control_, fixture_, {0, 3u}, 43).ok());  // MIG device 3 of GPU 0
  nvmlEventData_t data{};
  ASSERT_EQ(api_.nvmlEventSetWait_v2(set, &data, 10000), NVML_SUCCESS);
  EXPECT_EQ(data.eventData, 43u);
  EXPECT_EQ(data.gpuInstanceId, fixture_.gpus[0].mig[3].gi);
  EXPECT_EQ(data.computeInstanceId, 0u);
  EXPECT_EQ(api_.nvmlEventSetWait_v2(set, &data, 0), NVML_ERROR_TIMEOUT);
  EXPECT_EQ(api_.nvmlEventSetFree(set), NVML_SUCCESS);
  EXPECT_EQ(api_.nvmlEventSetFree(set), NVML_ERROR_INVALID_ARGUMENT);
}

TEST_F(SimDriverTest, ComputeModeIsSharedThroughControlState) {
  OpenAndInit("l4-pcie");
  nvmlDevice_t d = Handle(2);
  nvmlComputeMode_t mode{};
  ASSERT_EQ(api_.nvmlDeviceGetComputeMode(d, &mode), NVML_SUCCESS);
  EXPECT_EQ(mode, NVML_COMPUTEMODE_DEFAULT);
  ASSERT_EQ(api_.nvmlDeviceSetComputeMode(d, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS), NVML_SUCCESS);
  ASSERT_EQ(api_.nvmlDeviceGetComputeMode(d, &mode), NVML_SUCCESS);
  EXPECT_EQ(mode, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
  auto state = control_->Read();
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->Find(2)->compute_mode, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
  // A C caller may pass any integer for the enum; call the way one would.
  auto set_raw = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, int)>(
      reinterpret_cast<void*>(api_.nvmlDeviceSetComputeMode));
  EXPECT_EQ(set_raw(d, 9), NVML_ERROR_INVALID_ARGUMENT);
}

// GPULET_SIM_VISIBLE_DEVICES: what NVML shows in a container given GPUs 5 and 2 and one MIG
// device of GPU 0: three GPUs numbered 0..2 in PCI order, GPU 0 with only that MIG device.
TEST_F(SimDriverTest, VisibleDevicesRestrictEnumeration) {
  Result<std::string> path = ResolveFixture("dgx-a100");
  ASSERT_TRUE(path.ok());
  Result<Fixture> f = LoadFixture(*path);
  ASSERT_TRUE(f.ok());
  const std::string mig = f->gpus[0].mig[2].uuid;
  ASSERT_EQ(setenv("GPULET_SIM_VISIBLE_DEVICES", ("5,2," + mig).c_str(), 1), 0);
  OpenAndInit("dgx-a100");
  unsetenv("GPULET_SIM_VISIBLE_DEVICES");
  unsigned count = 0;
  ASSERT_EQ(api_.nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
  EXPECT_EQ(count, 3u);
  EXPECT_EQ(Uuid(Handle(0)), f->gpus[0].uuid);
  EXPECT_EQ(Uuid(Handle(1)), f->gpus[2].uuid);
  EXPECT_EQ(Uuid(Handle(2)), f->gpus[5].uuid);
  nvmlDevice_t d = nullptr;
  EXPECT_EQ(api_.nvmlDeviceGetHandleByIndex_v2(3, &d), NVML_ERROR_INVALID_ARGUMENT);
  std::vector<std::string> migs;
  for (unsigned i = 0; i < 7; ++i) {
    nvmlDevice_t m = nullptr;
    nvmlReturn_t rc = api_.nvmlDeviceGetMigDeviceHandleByIndex(Handle(0), i, &m);
    if (rc == NVML_SUCCESS) migs.push_back(Uuid(m));
  }
  EXPECT_EQ(migs, std::vector<std::string>{mig});
  unsigned minor = 0;
  ASSERT_EQ(api_.nvmlDeviceGetMinorNumber(Handle(2), &minor), NVML_SUCCESS);
  EXPECT_EQ(minor, f->gpus[5].minor);  // device files keep the host's minors
  EXPECT_EQ(api_.nvmlShutdown(), NVML_SUCCESS);
}

TEST_F(SimDriverTest, VisibleDevicesNamingNoDeviceFailsInit) {
  ASSERT_EQ(setenv("GPULET_SIM_VISIBLE_DEVICES", "GPU-not-here", 1), 0);
  Open("l4-pcie");
  EXPECT_NE(api_.nvmlInit_v2(), NVML_SUCCESS);
  unsetenv("GPULET_SIM_VISIBLE_DEVICES");
}

}  // namespace
}  // namespace gpulet::sim
