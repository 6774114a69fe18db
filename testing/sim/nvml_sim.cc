// The simulated NVML driver: exports the NVML C functions gpulet uses (GPULET_NVML_ALL_FUNCTIONS)
// with the driver's semantics, answering from a fixture (GPULET_SIM_FIXTURE, read at the first
// nvmlInit_v2) and the control state other processes write (GPULET_SIM_STATE/control.json).
//
// A C ABI library has no caller-owned object to keep its session in, so the session lives in one
// Driver owned by this file; every entry point takes its mutex. Event waits block outside it.
#include <dlfcn.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "sim/fixture_json.h"
#include "sim/nvml_sim_driver.h"

namespace gpulet::sim {

namespace {

// The fixture at `path`, read once: the parsed copy beside the state when it was parsed from the
// file's text (fixture_json.h), else that text parsed by the helper library beside this one,
// loaded now (and kept: it carries the shared C++ runtime, which is not unloaded safely). The
// helper's answer is then written beside the state for the next process.
Result<Fixture> LoadDriverFixture(const std::string& path, const std::string& state_dir) {
  const std::optional<std::string> text = ReadFixtureText(path);
  if (!text) return Status(ErrorCode::kNotFound, path + ": cannot read fixture");
  if (std::optional<Fixture> parsed = ReadParsedFixture(path, *text, state_dir)) return *parsed;
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&LoadDriverFixture), &self) == 0 ||
      self.dli_fname == nullptr) {
    return Status(ErrorCode::kInternal, "cannot find the simulated driver's own file");
  }
  const std::filesystem::path dir = std::filesystem::path(self.dli_fname).parent_path();
  void* helper = nullptr;
  std::string tried;
  for (const std::filesystem::path& candidate :
       {dir / kFixtureHelperLibrary, dir.parent_path() / kFixtureHelperLibrary}) {
    helper = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (helper != nullptr) break;
    const char* why = ::dlerror();
    tried += (tried.empty() ? "" : "; ") + std::string(why != nullptr ? why : candidate.c_str());
  }
  if (helper == nullptr) {
    return Status(ErrorCode::kNotFound, path + ": no parsed copy in " +
                                            ParsedFixturePath(state_dir) +
                                            ", and the YAML helper library cannot be loaded: " +
                                            tried);
  }
  auto parse = reinterpret_cast<GpuletSimParseFixtureFn>(::dlsym(helper, kParseFixtureSymbol));
  if (parse == nullptr) {
    return Status(ErrorCode::kInternal,
                  std::string(kFixtureHelperLibrary) + " has no " + kParseFixtureSymbol);
  }
  int ok = 0;
  char* answer = parse(text->c_str(), path.c_str(), &ok);
  if (answer == nullptr) return Status(ErrorCode::kInternal, path + ": out of memory");
  const std::string answered(answer);
  std::free(answer);
  if (!ok) return Status(ErrorCode::kInvalidInput, answered);
  Result<Fixture> fixture =
      FixtureFromJson(nlohmann::json::parse(answered, nullptr, /*allow_exceptions=*/false));
  if (fixture.ok()) (void)WriteParsedFixture(*fixture, path, *text, state_dir);
  return fixture;
}

}  // namespace

nvmlReturn_t Driver::Start() {
  const char* fixture_env = std::getenv("GPULET_SIM_FIXTURE");
  if (fixture_env == nullptr || *fixture_env == '\0') {
    std::fprintf(stderr, "gpulet-sim: GPULET_SIM_FIXTURE is not set (path of a fixture file)\n");
    return NVML_ERROR_UNKNOWN;
  }
  const char* state_env = std::getenv("GPULET_SIM_STATE");
  std::string state_dir =
      state_env != nullptr && *state_env != '\0' ? state_env : DefaultStateDir(fixture_env);
  Result<Fixture> loaded = LoadDriverFixture(fixture_env, state_dir);
  if (!loaded.ok()) {
    std::fprintf(stderr, "gpulet-sim: %s\n", loaded.status().message().c_str());
    return NVML_ERROR_UNKNOWN;
  }
  if (loaded->init_error) return *loaded->init_error;
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) {
    std::fprintf(stderr, "gpulet-sim: %s: %s\n", state_dir.c_str(), ec.message().c_str());
    return NVML_ERROR_UNKNOWN;
  }

  const char* visible_env = std::getenv("GPULET_SIM_VISIBLE_DEVICES");
  Result<std::optional<VisibleDevices>> restricted =
      ParseVisibleDevices(*loaded, visible_env != nullptr ? visible_env : "");
  if (!restricted.ok()) {
    std::fprintf(stderr, "gpulet-sim: %s\n", restricted.status().message().c_str());
    return NVML_ERROR_UNKNOWN;
  }

  FreeSession();
  visible = std::move(restricted).value();
  fixture = std::move(loaded).value();
  control = std::make_unique<ControlFile>(state_dir);
  watch = std::make_unique<ControlFileWatch>(control->path());
  state = ControlState{};
  for (const GpuSpec& g : fixture.gpus) {
    gpus.push_back(std::make_unique<nvmlDevice_st>(nvmlDevice_st{g.index, -1}));
    valid.insert(gpus.back().get());
    migs.emplace_back();
    base_mig.push_back(g.mig);
  }
  Refresh();
  return NVML_SUCCESS;
}

}  // namespace gpulet::sim

// gpulet's marker (not NVML): "this driver is simulated" (see nvml_api.h).
SIM_EXPORT int nvmlGpuletSimulated(void) { return 1; }

SIM_EXPORT nvmlReturn_t nvmlInit_v2(void) {
  return Guard([]() -> nvmlReturn_t {
    auto& d = TheDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.refcount > 0) {
      ++d.refcount;
      return NVML_SUCCESS;
    }
    nvmlReturn_t rc = d.Start();
    if (rc == NVML_SUCCESS) d.refcount = 1;
    return rc;
  });
}

SIM_EXPORT nvmlReturn_t nvmlShutdown(void) {
  return Guard([]() -> nvmlReturn_t {
    auto& d = TheDriver();
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.refcount == 0) return NVML_ERROR_UNINITIALIZED;
    --d.refcount;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
      return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED:
      return "Already Initialized";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER:
      return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT:
      return "Timeout";
    case NVML_ERROR_IRQ_ISSUE:
      return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND:
      return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND:
      return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM:
      return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED:
      return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM:
      return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
      return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE:
      return "In use by another client";
    case NVML_ERROR_MEMORY:
      return "Insufficient Memory";
    case NVML_ERROR_NO_DATA:
      return "No data";
    case NVML_ERROR_INSUFFICIENT_RESOURCES:
      return "Insufficient resources";
    case NVML_ERROR_NOT_READY:
      return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND:
      return "GPU not found";
    case NVML_ERROR_INVALID_STATE:
      return "Invalid state";
    default:
      return "Unknown Error";
  }
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    if (s.rc != NVML_SUCCESS) return s.rc;
    return gpulet::sim::CopyString(s.d.fixture.driver_version, version, length);
  });
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* version) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    if (s.rc != NVML_SUCCESS) return s.rc;
    if (version == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    *version = s.d.fixture.cuda_version;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    if (s.rc != NVML_SUCCESS) return s.rc;
    if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    *count = s.d.VisibleCount();
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    if (s.rc != NVML_SUCCESS) return s.rc;
    if (device == nullptr || index >= s.d.VisibleCount()) return NVML_ERROR_INVALID_ARGUMENT;
    index = s.d.HostIndex(index);
    if (s.d.Lost(index)) return NVML_ERROR_GPU_IS_LOST;
    *device = s.d.gpus[index].get();
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, uuid != nullptr, &t); rc != NVML_SUCCESS) return rc;
    return gpulet::sim::CopyString(t.mig != nullptr ? t.mig->uuid : t.gpu->uuid, uuid, length);
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, name != nullptr, &t); rc != NVML_SUCCESS) return rc;
    std::string value = t.gpu->name;
    if (t.mig != nullptr) value += " MIG " + t.mig->profile;
    return gpulet::sim::CopyString(value, name, length);
  });
}

#ifndef GPULET_SIM_OMIT_MEMORY_INFO
SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, memory != nullptr, &t); rc != NVML_SUCCESS) return rc;
    *memory = gpulet::sim::MemoryOf(s, t);
    return NVML_SUCCESS;
  });
}
#endif

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, pci != nullptr, &t); rc != NVML_SUCCESS) return rc;
    gpulet::sim::FillPci(*t.gpu, pci);
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int* minor) {
  return PhysicalQuery(device, minor != nullptr, [&](Session&, const gpulet::sim::GpuSpec& g) {
    *minor = g.minor;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major,
                                                           int* minor) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    nvmlReturn_t rc = Resolve(s, device, major != nullptr && minor != nullptr, &t);
    if (rc != NVML_SUCCESS) return rc;
    *major = t.gpu->cc_major;
    *minor = t.gpu->cc_minor;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device,
                                                  nvmlDeviceArchitecture_t* arch) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, arch != nullptr, &t); rc != NVML_SUCCESS) return rc;
    *arch = gpulet::sim::ArchitectureCode(t.gpu->architecture);
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int* current,
                                             unsigned int* pending) {
  return PhysicalQuery(device, current != nullptr && pending != nullptr,
                       [&](Session&, const gpulet::sim::GpuSpec& g) -> nvmlReturn_t {
                         if (!g.mig_capable) return NVML_ERROR_NOT_SUPPORTED;
                         *current = *pending =
                             g.mig_enabled() ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int* count) {
  return PhysicalQuery(device, count != nullptr,
                       [&](Session&, const gpulet::sim::GpuSpec& g) -> nvmlReturn_t {
                         if (!g.mig_capable) return NVML_ERROR_NOT_SUPPORTED;
                         *count = 7;
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                            nvmlDevice_t* mig) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, mig != nullptr, &t); rc != NVML_SUCCESS) return rc;
    if (t.mig != nullptr || index >= 7) return NVML_ERROR_INVALID_ARGUMENT;
    if (!t.gpu->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    const auto& handles = s.d.migs[t.gpu->index];
    if (index >= t.gpu->mig.size() || index >= handles.size()) return NVML_ERROR_NOT_FOUND;
    if (s.d.visible && !s.d.visible->MigVisible(t.gpu->index, t.gpu->mig[index].uuid)) {
      return NVML_ERROR_NOT_FOUND;  // another container's MIG device
    }
    *mig = handles[index].get();
    return NVML_SUCCESS;
  });
}

namespace {
template <typename F>
nvmlReturn_t MigQuery(nvmlDevice_t device, bool outputs_ok, F&& fill) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, outputs_ok, &t); rc != NVML_SUCCESS) return rc;
    if (t.mig == nullptr) return NVML_ERROR_NOT_SUPPORTED;
    return fill(*t.gpu, *t.mig);
  });
}
}  // namespace

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int* id) {
  return MigQuery(device, id != nullptr, [&](const auto&, const auto& m) {
    *id = m.gi;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int* id) {
  return MigQuery(device, id != nullptr, [&](const auto&, const auto& m) {
    *id = m.ci;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                                   nvmlDeviceAttributes_t* attributes) {
  return MigQuery(device, attributes != nullptr, [&](const auto&, const auto& m) {
    std::memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = m.facts.sms;
    attributes->sharedCopyEngineCount = m.facts.slices;
    attributes->sharedDecoderCount = m.facts.slices / 2;
    attributes->sharedJpegCount = m.facts.slices == 7 ? 1 : 0;
    attributes->sharedOfaCount = m.facts.slices == 7 ? 1 : 0;
    attributes->gpuInstanceSliceCount = m.facts.slices;
    attributes->computeInstanceSliceCount = m.facts.slices;
    attributes->memorySizeMB = m.facts.memory_mb;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b,
                                                            nvmlGpuTopologyLevel_t* level) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target ta, tb;
    if (nvmlReturn_t rc = Resolve(s, a, level != nullptr, &ta); rc != NVML_SUCCESS) return rc;
    if (nvmlReturn_t rc = Resolve(s, b, true, &tb); rc != NVML_SUCCESS) return rc;
    if (ta.mig != nullptr || tb.mig != nullptr) return NVML_ERROR_NOT_SUPPORTED;
    const auto& ga = *ta.gpu;
    const auto& gb = *tb.gpu;
    if (ga.index == gb.index) {
      *level = NVML_TOPOLOGY_INTERNAL;
    } else if (ga.pcie_switch >= 0 && ga.pcie_switch == gb.pcie_switch) {
      *level = NVML_TOPOLOGY_MULTIPLE;
    } else if (ga.numa >= 0 && ga.numa == gb.numa) {
      *level = NVML_TOPOLOGY_NODE;
    } else {
      *level = NVML_TOPOLOGY_SYSTEM;
    }
    return NVML_SUCCESS;
  });
}

// NVLink i of a GPU leads to the peer NvlinkPeers()[i]. A GPU with NVLinks reports every index
// below max(NVML_NVLINK_MAX_LINKS, its link count); unused ones are disabled, not errors.
namespace {
// The remote end of one NVLink: a peer GPU (peer >= 0), an NVSwitch (*to_switch), or nothing.
nvmlReturn_t NvlinkPeer(Session& s, const gpulet::sim::GpuSpec& g, unsigned link, int* peer,
                        bool* to_switch = nullptr) {
  if (to_switch != nullptr) *to_switch = false;
  if (s.d.fixture.nvswitch_links > 0) {
    if (link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    *peer = -1;
    if (link < s.d.fixture.nvswitch_links) {
      *peer = -2;  // active, to a switch
      if (to_switch != nullptr) *to_switch = true;
    }
    return NVML_SUCCESS;
  }
  const std::vector<unsigned> peers = s.d.fixture.NvlinkPeers(g.index);
  if (peers.empty()) return NVML_ERROR_NOT_SUPPORTED;
  if (link >= std::max<size_t>(NVML_NVLINK_MAX_LINKS, peers.size())) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  *peer = link < peers.size() ? static_cast<int>(peers[link]) : -1;
  return NVML_SUCCESS;
}
}  // namespace

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                 nvmlEnableState_t* active) {
  return PhysicalQuery(device, active != nullptr,
                       [&](Session& s, const gpulet::sim::GpuSpec& g) -> nvmlReturn_t {
                         int peer = -1;
                         nvmlReturn_t rc = NvlinkPeer(s, g, link, &peer);
                         if (rc != NVML_SUCCESS) return rc;
                         *active = peer != -1 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                            nvmlPciInfo_t* pci) {
  return PhysicalQuery(device, pci != nullptr,
                       [&](Session& s, const gpulet::sim::GpuSpec& g) -> nvmlReturn_t {
                         int peer = -1;
                         bool to_switch = false;
                         nvmlReturn_t rc = NvlinkPeer(s, g, link, &peer, &to_switch);
                         if (rc != NVML_SUCCESS) return rc;
                         if (to_switch) {
                           // Six NVSwitches on a board of their own; links spread over them.
                           gpulet::sim::GpuSpec sw;
                           sw.bus = 0xe0 + (link % 6);
                           gpulet::sim::FillPci(sw, pci);
                           return NVML_SUCCESS;
                         }
                         if (peer < 0) return NVML_ERROR_NOT_SUPPORTED;  // link not trained
                         gpulet::sim::FillPci(s.d.fixture.gpus[static_cast<size_t>(peer)], pci);
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                            nvmlIntNvLinkDeviceType_t* type) {
  return PhysicalQuery(
      device, type != nullptr, [&](Session& s, const gpulet::sim::GpuSpec& g) -> nvmlReturn_t {
        int peer = -1;
        bool to_switch = false;
        nvmlReturn_t rc = NvlinkPeer(s, g, link, &peer, &to_switch);
        if (rc != NVML_SUCCESS) return rc;
        if (peer == -1) return NVML_ERROR_NOT_SUPPORTED;
        *type = to_switch ? NVML_NVLINK_DEVICE_TYPE_SWITCH : NVML_NVLINK_DEVICE_TYPE_GPU;
        return NVML_SUCCESS;
      });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                                 nvmlTemperatureSensors_t sensor,
                                                 unsigned int* temp) {
  return PhysicalQuery(device, temp != nullptr && RawEnum(sensor) == NVML_TEMPERATURE_GPU,
                       [&](Session& s, const gpulet::sim::GpuSpec& g) {
                         *temp = gpulet::sim::Now(s, g).temperature_c;
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                      nvmlUtilization_t* utilization) {
  return PhysicalQuery(device, utilization != nullptr,
                       [&](Session& s, const gpulet::sim::GpuSpec& g) {
                         const auto now = gpulet::sim::Now(s, g);
                         utilization->gpu = now.gpu_util;
                         utilization->memory = now.mem_util;
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* milliwatts) {
  return PhysicalQuery(device, milliwatts != nullptr,
                       [&](Session& s, const gpulet::sim::GpuSpec& g) {
                         *milliwatts = gpulet::sim::Now(s, g).power_mw;
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                            unsigned long long* millijoules) {
  return PhysicalQuery(device, millijoules != nullptr,
                       [&](Session& s, const gpulet::sim::GpuSpec& g) {
                         *millijoules = gpulet::sim::Now(s, g).energy_mj;
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                               unsigned int* mhz) {
  const int clock = RawEnum(type);
  const bool known = clock == NVML_CLOCK_GRAPHICS || clock == NVML_CLOCK_SM ||
                     clock == NVML_CLOCK_MEM || clock == NVML_CLOCK_VIDEO;
  return PhysicalQuery(device, mhz != nullptr && known,
                       [&](Session& s, const gpulet::sim::GpuSpec& g) {
                         const auto now = gpulet::sim::Now(s, g);
                         switch (clock) {
                           case NVML_CLOCK_MEM:
                             *mhz = now.mem_clock_mhz;
                             break;
                           case NVML_CLOCK_VIDEO:
                             *mhz = now.sm_clock_mhz * 9 / 10;
                             break;
                           default:
                             *mhz = now.sm_clock_mhz;
                             break;
                         }
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device,
                                                    nvmlMemoryErrorType_t errorType,
                                                    nvmlEccCounterType_t counterType,
                                                    unsigned long long* count) {
  const int error = RawEnum(errorType), counter = RawEnum(counterType);
  const bool known =
      (error == NVML_MEMORY_ERROR_TYPE_CORRECTED || error == NVML_MEMORY_ERROR_TYPE_UNCORRECTED) &&
      (counter == NVML_VOLATILE_ECC || counter == NVML_AGGREGATE_ECC);
  return PhysicalQuery(
      device, count != nullptr && known, [&](Session& s, const gpulet::sim::GpuSpec& g) {
        const auto now = gpulet::sim::Now(s, g);
        *count =
            error == NVML_MEMORY_ERROR_TYPE_CORRECTED ? now.ecc_corrected : now.ecc_uncorrected;
        return NVML_SUCCESS;
      });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int* value) {
  return PhysicalQuery(device, value != nullptr, [&](Session& s, const gpulet::sim::GpuSpec& g) {
    *value = gpulet::sim::Now(s, g).pcie_replays;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t* mode) {
  return PhysicalQuery(device, mode != nullptr, [&](Session& s, const gpulet::sim::GpuSpec& g) {
    const auto* o = s.d.Overrides(g.index);
    *mode = static_cast<nvmlComputeMode_t>(
        o != nullptr && o->compute_mode ? *o->compute_mode : NVML_COMPUTEMODE_DEFAULT);
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode) {
  const int raw = RawEnum(mode);
  const bool known = raw == NVML_COMPUTEMODE_DEFAULT || raw == NVML_COMPUTEMODE_EXCLUSIVE_THREAD ||
                     raw == NVML_COMPUTEMODE_PROHIBITED ||
                     raw == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS;
  return PhysicalQuery(device, known, [&](Session& s, const gpulet::sim::GpuSpec& g) {
    gpulet::sim::GpuOverrides set;
    set.compute_mode = raw;
    if (!gpulet::sim::SetOverrides(*s.d.control, g.index, set).ok()) {
      return NVML_ERROR_UNKNOWN;
    }
    s.d.Refresh();
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device,
                                                        unsigned int* utilization,
                                                        unsigned int* sampling_period_us) {
  return PhysicalQuery(device, utilization != nullptr && sampling_period_us != nullptr,
                       [&](Session& s, const gpulet::sim::GpuSpec& g) {
                         *utilization = gpulet::sim::Now(s, g).gpu_util / 4;
                         *sampling_period_us = 167000;
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device,
                                                        unsigned int* utilization,
                                                        unsigned int* sampling_period_us) {
  return PhysicalQuery(device, utilization != nullptr && sampling_period_us != nullptr,
                       [&](Session& s, const gpulet::sim::GpuSpec& g) {
                         *utilization = gpulet::sim::Now(s, g).gpu_util / 6;
                         *sampling_period_us = 167000;
                         return NVML_SUCCESS;
                       });
}

// Each injected double-bit error retires one row; the remap is pending until a reset.
SIM_EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int* corr_rows,
                                                  unsigned int* unc_rows, unsigned int* is_pending,
                                                  unsigned int* failure_occurred) {
  const bool ok = corr_rows != nullptr && unc_rows != nullptr && is_pending != nullptr &&
                  failure_occurred != nullptr;
  return PhysicalQuery(device, ok, [&](Session& s, const gpulet::sim::GpuSpec& g) -> nvmlReturn_t {
    if (g.cc_major < 8) return NVML_ERROR_NOT_SUPPORTED;  // row remapping arrived with Ampere
    const auto* o = s.d.Overrides(g.index);
    const unsigned unc = o != nullptr ? static_cast<unsigned>(o->ecc_double_bit) : 0;
    *corr_rows = 0;
    *unc_rows = unc;
    *is_pending = unc > 0 ? 1 : 0;
    *failure_occurred = 0;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                                  unsigned long long* reasons) {
  return PhysicalQuery(device, reasons != nullptr, [&](Session& s, const gpulet::sim::GpuSpec& g) {
    const auto now = gpulet::sim::Now(s, g);
    constexpr unsigned long long kGpuIdle = 0x1, kSwThermal = 0x20, kSwPowerCap = 0x4;
    *reasons = 0;
    if (now.gpu_util == 0) *reasons |= kGpuIdle;
    if (now.temperature_c >= 87) *reasons |= kSwThermal;
    if (now.power_mw >= g.power_limit_w * 1000) *reasons |= kSwPowerCap;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    if (s.rc != NVML_SUCCESS) return s.rc;
    if (set == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    auto created = std::make_unique<nvmlEventSet_st>();
    // Watch before taking the position: a change after this point wakes the waiter.
    created->inotify_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (created->inotify_fd < 0 ||
        ::inotify_add_watch(created->inotify_fd, s.d.control->state_dir().c_str(),
                            IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE) < 0) {
      if (created->inotify_fd >= 0) ::close(created->inotify_fd);
      return NVML_ERROR_OPERATING_SYSTEM;
    }
    s.d.watch->Changed();  // force: the position must reflect everything queued so far
    if (auto current = s.d.control->Read(); current.ok()) s.d.state = std::move(current).value();
    created->next_seq = s.d.state.next_seq;
    *set = created.get();
    s.d.event_sets.insert(created.release());
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                                 nvmlEventSet_t set) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    bool set_ok = set != nullptr && s.d.event_sets.count(set) != 0;
    if (nvmlReturn_t rc = Resolve(s, device, set_ok, &t); rc != NVML_SUCCESS) return rc;
    if (t.mig != nullptr) return NVML_ERROR_NOT_SUPPORTED;  // register on the parent GPU
    if (eventTypes == 0 || (eventTypes & ~gpulet::sim::kSupportedEvents) != 0)
      return NVML_ERROR_NOT_SUPPORTED;
    for (auto& [gpu, mask] : set->registered) {
      if (gpu == t.gpu->index) {
        mask |= eventTypes;
        return NVML_SUCCESS;
      }
    }
    set->registered.emplace_back(t.gpu->index, eventTypes);
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data,
                                            unsigned int timeoutms) {
  return Guard([&]() -> nvmlReturn_t {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeoutms);
    int fd = -1;
    for (;;) {
      {
        Session s;
        if (s.rc != NVML_SUCCESS) return s.rc;
        if (set == nullptr || data == nullptr || s.d.event_sets.count(set) == 0) {
          return NVML_ERROR_INVALID_ARGUMENT;
        }
        fd = set->inotify_fd;
        gpulet::sim::DrainInotify(fd);  // changes before this read are seen by Refresh below
        s.d.Refresh();
        if (gpulet::sim::TakeEvent(s.d, set, data)) return NVML_SUCCESS;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return NVML_ERROR_TIMEOUT;
      pollfd p{fd, POLLIN, 0};
      int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
      if (n < 0 && errno != EINTR) return NVML_ERROR_UNKNOWN;
    }
  });
}

SIM_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    if (s.rc != NVML_SUCCESS) return s.rc;
    if (set == nullptr || s.d.event_sets.erase(set) == 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (set->inotify_fd >= 0) ::close(set->inotify_fd);
    delete set;
    return NVML_SUCCESS;
  });
}
