// The simulated NVML driver: exports the NVML C functions gpulet uses (GPULET_NVML_ALL_FUNCTIONS)
// with the driver's semantics, answering from a fixture (GPULET_SIM_FIXTURE, read at the first
// nvmlInit_v2) and the control state other processes write (GPULET_SIM_STATE/control.json).
//
// A C ABI library has no caller-owned object to keep its session in, so the session lives in one
// Driver owned by this file; every entry point takes its mutex. Event waits block outside it.
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <string>
#include <unordered_set>
#include <vector>

#include "gpu/nvml_api.h"
#include "sim/control.h"
#include "sim/fixture.h"
#include "sim/mig_layout.h"
#include "sim/simulation.h"
#include "sim/telemetry.h"

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

// Every function gpulet resolves is declared here with default visibility, so a definition whose
// signature drifted from nvml_api.h fails to compile.
#define GPULET_SIM_DECLARE(name, ret, params) SIM_EXPORT ret name params;
GPULET_NVML_ALL_FUNCTIONS(GPULET_SIM_DECLARE)
#undef GPULET_SIM_DECLARE

// Opaque handle types of the API, defined by the driver.
struct nvmlDevice_st {
  unsigned gpu = 0;
  int mig = -1;  // index among the GPU's MIG devices; -1: the physical GPU
};

// GPU and compute instances are named by their ids; a handle outlives the instance (the driver
// then answers NVML_ERROR_INVALID_ARGUMENT) and is freed with the session.
struct nvmlGpuInstance_st {
  unsigned gpu = 0;
  unsigned gi = 0;
};

struct nvmlComputeInstance_st {
  unsigned gpu = 0;
  unsigned gi = 0;
  unsigned ci = 0;
};

struct nvmlEventSet_st {
  uint64_t next_seq = 0;  // first event sequence this set may see
  std::vector<std::pair<unsigned, unsigned long long>> registered;  // (gpu, event mask)
  int inotify_fd = -1;  // watches the state dir for control changes
};

namespace gpulet::sim {
namespace {

constexpr unsigned long long kSupportedEvents =
    nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |
    nvmlEventTypeXidCriticalError | nvmlEventTypeClock | nvmlEventTypeMigConfigChange;

class Driver {
 public:
  ~Driver() { FreeSession(); }

  std::mutex mu;
  int refcount = 0;
  Fixture fixture;
  std::unique_ptr<ControlFile> control;
  std::unique_ptr<ControlFileWatch> watch;
  ControlState state;
  std::vector<std::unique_ptr<nvmlDevice_st>> gpus;               // by GPU index
  std::vector<std::vector<std::unique_ptr<nvmlDevice_st>>> migs;  // by GPU index, MIG index
  std::unordered_set<const nvmlDevice_st*> valid;
  std::unordered_set<nvmlEventSet_st*> event_sets;
  std::vector<std::vector<MigDeviceSpec>> base_mig;  // the fixture's MIG devices, by GPU index
  std::map<std::pair<unsigned, unsigned>, std::unique_ptr<nvmlGpuInstance_st>> gi_handles;
  std::map<std::tuple<unsigned, unsigned, unsigned>, std::unique_ptr<nvmlComputeInstance_st>>
      ci_handles;

  nvmlReturn_t Start();

  // The GPU's live MIG layout: the control state's once changed, else the fixture's.
  MigLayoutState Layout(unsigned gpu) const {
    auto it = state.mig.find(gpu);
    return it != state.mig.end() ? it->second : LayoutFromFixture(base_mig[gpu]);
  }

  // Rebuilds every GPU's MIG devices from the layouts in `state`. MIG device handles are
  // allocated per index and never freed during a session, so a caller's stale handle stays
  // safe to pass (Resolve rejects an index past the current devices).
  void ApplyLayouts() {
    for (GpuSpec& g : fixture.gpus) {
      auto it = state.mig.find(g.index);
      if (it == state.mig.end()) {
        g.mig = base_mig[g.index];
        g.mig_mode = false;
      } else {
        g.mig = MigDevicesOf(fixture, g, base_mig[g.index], it->second);
        g.mig_mode = it->second.enabled;
      }
      auto& handles = migs[g.index];
      while (handles.size() < g.mig.size()) {
        handles.push_back(std::make_unique<nvmlDevice_st>(
            nvmlDevice_st{g.index, static_cast<int>(handles.size())}));
        valid.insert(handles.back().get());
      }
    }
  }

  // Re-reads the control file when another process replaced it. A file that fails to parse
  // keeps the last good state (a writer never leaves one; a human editing it might).
  void Refresh() {
    if (!watch->Changed()) return;
    Result<ControlState> s = control->Read();
    if (s.ok()) state = std::move(s).value();
    ApplyLayouts();
  }

  const GpuOverrides* Overrides(unsigned gpu) const { return state.Find(gpu); }
  bool Lost(unsigned gpu) const {
    const GpuOverrides* o = Overrides(gpu);
    return o != nullptr && o->lost;
  }

  void FreeSession() {
    for (nvmlEventSet_st* set : event_sets) {
      if (set->inotify_fd >= 0) ::close(set->inotify_fd);
      delete set;
    }
    event_sets.clear();
    valid.clear();
    gpus.clear();
    migs.clear();
    base_mig.clear();
    gi_handles.clear();
    ci_handles.clear();
  }
};

Driver& TheDriver() {
  static Driver driver;
  return driver;
}

nvmlReturn_t Driver::Start() {
  const char* fixture_env = std::getenv("GPULET_SIM_FIXTURE");
  if (fixture_env == nullptr || *fixture_env == '\0') {
    std::fprintf(stderr, "gpulet-sim: GPULET_SIM_FIXTURE is not set (path of a fixture file)\n");
    return NVML_ERROR_UNKNOWN;
  }
  Result<Fixture> loaded = LoadFixture(fixture_env);
  if (!loaded.ok()) {
    std::fprintf(stderr, "gpulet-sim: %s\n", loaded.status().message().c_str());
    return NVML_ERROR_UNKNOWN;
  }
  if (loaded->init_error) return *loaded->init_error;
  const char* state_env = std::getenv("GPULET_SIM_STATE");
  std::string state_dir =
      state_env != nullptr && *state_env != '\0' ? state_env : DefaultStateDir(fixture_env);
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) {
    std::fprintf(stderr, "gpulet-sim: %s: %s\n", state_dir.c_str(), ec.message().c_str());
    return NVML_ERROR_UNKNOWN;
  }

  FreeSession();
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

// Runs an entry point's body; nothing thrown may cross the C ABI.
template <typename F>
nvmlReturn_t Guard(F&& body) {
  try {
    return body();
  } catch (...) {
    return NVML_ERROR_UNKNOWN;
  }
}

// The state an entry point works on: the locked driver, refreshed.
struct Session {
  Driver& d = TheDriver();
  std::unique_lock<std::mutex> lock{d.mu};
  nvmlReturn_t rc = NVML_SUCCESS;

  Session() {
    if (d.refcount == 0) {
      rc = NVML_ERROR_UNINITIALIZED;
      return;
    }
    d.Refresh();
  }
};

// A device handle resolved against the session.
struct Target {
  const GpuSpec* gpu = nullptr;
  const MigDeviceSpec* mig = nullptr;  // null for the physical GPU
};

// Checks in the driver's order: initialised, valid arguments, GPU not lost.
nvmlReturn_t Resolve(Session& s, nvmlDevice_t device, bool outputs_ok, Target* t) {
  if (s.rc != NVML_SUCCESS) return s.rc;
  if (device == nullptr || !outputs_ok || s.d.valid.count(device) == 0) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  t->gpu = &s.d.fixture.gpus[device->gpu];
  if (device->mig >= 0 && static_cast<size_t>(device->mig) >= t->gpu->mig.size()) {
    return NVML_ERROR_INVALID_ARGUMENT;  // the MIG device was destroyed
  }
  t->mig = device->mig >= 0 ? &t->gpu->mig[static_cast<size_t>(device->mig)] : nullptr;
  if (s.d.Lost(device->gpu)) return NVML_ERROR_GPU_IS_LOST;
  return NVML_SUCCESS;
}

nvmlReturn_t CopyString(const std::string& value, char* out, unsigned length) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (length < value.size() + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, value.c_str(), value.size() + 1);
  return NVML_SUCCESS;
}

void FillPci(const GpuSpec& g, nvmlPciInfo_t* pci) {
  std::memset(pci, 0, sizeof *pci);
  std::snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", g.domain, g.bus,
                g.device, g.function);
  std::snprintf(pci->busId, sizeof pci->busId, "%s", g.NvmlBusId().c_str());
  pci->domain = g.domain;
  pci->bus = g.bus;
  pci->device = g.device;
  pci->pciDeviceId = g.pci_device_id;
  pci->pciSubSystemId = g.pci_subsystem_id;
}

Telemetry Now(const Session& s, const GpuSpec& g) {
  return ComputeTelemetry(s.d.fixture, g, WallClockMs(), s.d.Overrides(g.index));
}

nvmlDeviceArchitecture_t ArchitectureCode(const std::string& a) {
  if (a == "kepler") return NVML_DEVICE_ARCH_KEPLER;
  if (a == "maxwell") return NVML_DEVICE_ARCH_MAXWELL;
  if (a == "pascal") return NVML_DEVICE_ARCH_PASCAL;
  if (a == "volta") return NVML_DEVICE_ARCH_VOLTA;
  if (a == "turing") return NVML_DEVICE_ARCH_TURING;
  if (a == "ampere") return NVML_DEVICE_ARCH_AMPERE;
  if (a == "ada") return NVML_DEVICE_ARCH_ADA;
  if (a == "hopper") return NVML_DEVICE_ARCH_HOPPER;
  if (a == "blackwell") return NVML_DEVICE_ARCH_BLACKWELL;
  return 0xFFFFFFFFu;  // NVML_DEVICE_ARCH_UNKNOWN
}

// Physical-GPU telemetry query: MIG handles answer NOT_SUPPORTED, as on the driver.
template <typename F>
nvmlReturn_t PhysicalQuery(nvmlDevice_t device, bool outputs_ok, F&& fill) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, outputs_ok, &t); rc != NVML_SUCCESS) return rc;
    if (t.mig != nullptr) return NVML_ERROR_NOT_SUPPORTED;
    return fill(s, *t.gpu);
  });
}

// The first queued event at or after the set's position that the set registered for.
bool TakeEvent(Driver& d, nvmlEventSet_st* set, nvmlEventData_t* data) {
  for (const SimEvent& e : d.state.events) {
    if (e.seq < set->next_seq) continue;
    set->next_seq = e.seq + 1;
    for (const auto& [gpu, mask] : set->registered) {
      if (gpu != e.gpu || (mask & e.type) == 0) continue;
      data->device = d.gpus[gpu].get();
      data->eventType = e.type;
      data->eventData = e.data;
      data->gpuInstanceId = e.gpu_instance;
      data->computeInstanceId = e.compute_instance;
      return true;
    }
  }
  return false;
}

// The integer a caller passed for a C enum parameter: C callers may pass any value, and reading
// an out-of-range one through the C++ enum type is undefined.
template <typename E>
int RawEnum(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

void DrainInotify(int fd) {
  alignas(inotify_event) char buf[4096];
  while (::read(fd, buf, sizeof buf) > 0) {
  }
}

}  // namespace
}  // namespace gpulet::sim

using gpulet::sim::Guard;
using gpulet::sim::PhysicalQuery;
using gpulet::sim::RawEnum;
using gpulet::sim::Resolve;
using gpulet::sim::Session;
using gpulet::sim::Target;
using gpulet::sim::TheDriver;

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
    *count = static_cast<unsigned>(s.d.fixture.gpus.size());
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    if (s.rc != NVML_SUCCESS) return s.rc;
    if (device == nullptr || index >= s.d.gpus.size()) return NVML_ERROR_INVALID_ARGUMENT;
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

namespace gpulet::sim {
// Framebuffer use of a GPU or MIG device (nvmlDeviceGetMemoryInfo and its v2).
nvmlMemory_t MemoryOf(const Session& s, const Target& t) {
  constexpr unsigned long long kMiB = 1024ULL * 1024ULL;
  const Telemetry now = Now(s, *t.gpu);
  unsigned long long total = t.gpu->memory_mib * kMiB;
  unsigned long long used = now.memory_used_mib * kMiB;
  if (t.mig != nullptr) {  // a MIG device uses its share of the GPU's simulated load
    total = t.mig->facts.memory_mb * kMiB;
    used = static_cast<unsigned long long>(static_cast<double>(total) *
                                           static_cast<double>(now.memory_used_mib) /
                                           static_cast<double>(t.gpu->memory_mib));
  }
  nvmlMemory_t m{};
  m.total = total;
  m.used = std::min(used, total);
  m.free = total - m.used;
  return m;
}
}  // namespace gpulet::sim

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

// ---- MIG management: every change is one ControlFile::Update of the GPU's layout. ----
namespace gpulet::sim {
namespace {

// Runs `op` on GPU `gpu`'s layout inside the control file's lock and stores the layout when op
// succeeds. `op(state, layout)` returns an nvmlReturn_t.
template <typename F>
nvmlReturn_t ChangeLayout(Session& s, unsigned gpu, F&& op) {
  nvmlReturn_t rc = NVML_SUCCESS;
  Result<ControlState> updated = s.d.control->Update([&](ControlState& st) {
    auto it = st.mig.find(gpu);
    MigLayoutState layout =
        it != st.mig.end() ? it->second : LayoutFromFixture(s.d.base_mig[gpu]);
    rc = op(st, layout);
    if (rc == NVML_SUCCESS) st.mig[gpu] = std::move(layout);
  });
  if (!updated.ok()) return NVML_ERROR_UNKNOWN;
  s.d.Refresh();
  return rc;
}

// The fault hook: true when this create is the one `gpulet sim`/a test asked to fail.
bool CreateFails(ControlState& st) {
  if (st.mig_create_fail_countdown == 0) return false;
  return --st.mig_create_fail_countdown == 0;
}

// A physical, MIG-capable GPU with MIG enabled.
nvmlReturn_t ResolveMigParent(Session& s, nvmlDevice_t device, bool outputs_ok, Target* t) {
  if (nvmlReturn_t rc = Resolve(s, device, outputs_ok, t); rc != NVML_SUCCESS) return rc;
  if (t->mig != nullptr || !t->gpu->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
  return NVML_SUCCESS;
}

nvmlGpuInstance_t GpuInstanceHandle(Driver& d, unsigned gpu, unsigned gi) {
  auto& h = d.gi_handles[{gpu, gi}];
  if (!h) h = std::make_unique<nvmlGpuInstance_st>(nvmlGpuInstance_st{gpu, gi});
  return h.get();
}

nvmlComputeInstance_t ComputeInstanceHandle(Driver& d, unsigned gpu, unsigned gi, unsigned ci) {
  auto& h = d.ci_handles[{gpu, gi, ci}];
  if (!h) h = std::make_unique<nvmlComputeInstance_st>(nvmlComputeInstance_st{gpu, gi, ci});
  return h.get();
}

// A GPU instance handle that names a live instance.
nvmlReturn_t ResolveGi(Session& s, nvmlGpuInstance_t gi, bool outputs_ok, MigInstanceState* out) {
  if (s.rc != NVML_SUCCESS) return s.rc;
  if (gi == nullptr || !outputs_ok) return NVML_ERROR_INVALID_ARGUMENT;
  auto it = s.d.gi_handles.find({gi->gpu, gi->gi});
  if (it == s.d.gi_handles.end() || it->second.get() != gi) return NVML_ERROR_INVALID_ARGUMENT;
  if (s.d.Lost(gi->gpu)) return NVML_ERROR_GPU_IS_LOST;
  for (const auto& i : s.d.Layout(gi->gpu).instances) {
    if (i.gi == gi->gi) {
      *out = i;
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_INVALID_ARGUMENT;
}

void FillGpuInstanceProfile(const MigProfile& p, nvmlGpuInstanceProfileInfo_t* info) {
  std::memset(info, 0, sizeof *info);
  info->id = p.id;
  info->isP2pSupported = 0;
  info->sliceCount = p.slices;
  info->instanceCount = static_cast<unsigned>(p.placements.size());
  info->multiprocessorCount = p.sms;
  info->copyEngineCount = p.slices;
  info->decoderCount = p.slices / 2;
  info->encoderCount = p.slices == 7 ? 1 : 0;
  info->jpegCount = p.slices == 7 ? 1 : 0;
  info->ofaCount = p.slices == 7 ? 1 : 0;
  info->memorySizeMB = p.memory_mb;
}

}  // namespace
}  // namespace gpulet::sim

using gpulet::sim::ChangeLayout;
using gpulet::sim::ControlState;
using gpulet::sim::MigLayoutState;
using gpulet::sim::MigInstanceState;

SIM_EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                             nvmlReturn_t* activationStatus) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    const bool known = mode == NVML_DEVICE_MIG_ENABLE || mode == NVML_DEVICE_MIG_DISABLE;
    nvmlReturn_t rc = gpulet::sim::ResolveMigParent(s, device, activationStatus != nullptr && known, &t);
    if (rc != NVML_SUCCESS) return rc;
    const auto& g = *t.gpu;
    // The simulated GPU activates the new mode at once (no reset pending).
    rc = ChangeLayout(s, g.index, [&](ControlState&, MigLayoutState& layout) {
      return gpulet::sim::SetMigModeInLayout(g, layout, mode == NVML_DEVICE_MIG_ENABLE);
    });
    *activationStatus = rc;
    return rc;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device,
                                                            unsigned int profile,
                                                            nvmlGpuInstanceProfileInfo_t* info) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    nvmlReturn_t rc = gpulet::sim::ResolveMigParent(s, device, info != nullptr, &t);
    if (rc != NVML_SUCCESS) return rc;
    if (profile >= NVML_GPU_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    const auto* p = gpulet::sim::FindMigProfileById(s.d.fixture, profile, nullptr);
    if (p == nullptr) return NVML_ERROR_NOT_SUPPORTED;
    gpulet::sim::FillGpuInstanceProfile(*p, info);
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t* placements,
    unsigned int* count) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    nvmlReturn_t rc = gpulet::sim::ResolveMigParent(s, device, count != nullptr, &t);
    if (rc != NVML_SUCCESS) return rc;
    const auto* p = gpulet::sim::FindMigProfileById(s.d.fixture, profileId, nullptr);
    if (p == nullptr) return NVML_ERROR_NOT_SUPPORTED;
    const auto n = static_cast<unsigned>(p->placements.size());
    if (placements == nullptr) {  // a size query
      *count = n;
      return NVML_SUCCESS;
    }
    if (*count < n) {
      *count = n;
      return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; ++i) placements[i] = {p->placements[i], p->placement_size};
    *count = n;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t* placement,
    nvmlGpuInstance_t* gpuInstance) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    nvmlReturn_t rc = gpulet::sim::ResolveMigParent(
        s, device, placement != nullptr && gpuInstance != nullptr, &t);
    if (rc != NVML_SUCCESS) return rc;
    const auto* p = gpulet::sim::FindMigProfileById(s.d.fixture, profileId, nullptr);
    if (p == nullptr) return NVML_ERROR_NOT_SUPPORTED;
    if (placement->size != p->placement_size) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned gi = 0;
    rc = ChangeLayout(s, t.gpu->index, [&](ControlState& st, MigLayoutState& layout) {
      if (!layout.enabled) return static_cast<int>(NVML_ERROR_INVALID_STATE);
      if (gpulet::sim::CreateFails(st)) return static_cast<int>(NVML_ERROR_INSUFFICIENT_RESOURCES);
      return gpulet::sim::CreateGpuInstanceInLayout(s.d.fixture, layout, profileId,
                                                    placement->start, &gi);
    });
    if (rc == NVML_SUCCESS) *gpuInstance = gpulet::sim::GpuInstanceHandle(s.d, t.gpu->index, gi);
    return rc;
  });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                                  nvmlGpuInstance_t* gpuInstances,
                                                  unsigned int* count) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    nvmlReturn_t rc = gpulet::sim::ResolveMigParent(
        s, device, gpuInstances != nullptr && count != nullptr, &t);
    if (rc != NVML_SUCCESS) return rc;
    std::string name;
    if (gpulet::sim::FindMigProfileById(s.d.fixture, profileId, &name) == nullptr) {
      return NVML_ERROR_NOT_SUPPORTED;
    }
    const MigLayoutState layout = s.d.Layout(t.gpu->index);
    if (!layout.enabled) return NVML_ERROR_INVALID_STATE;
    std::vector<unsigned> ids;
    for (const auto& i : layout.instances) {
      if (i.profile == name) ids.push_back(i.gi);
    }
    if (*count < ids.size()) {
      *count = static_cast<unsigned>(ids.size());
      return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      gpuInstances[i] = gpulet::sim::GpuInstanceHandle(s.d, t.gpu->index, ids[i]);
    }
    *count = static_cast<unsigned>(ids.size());
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance,
                                               nvmlGpuInstanceInfo_t* info) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    MigInstanceState inst;
    nvmlReturn_t rc = gpulet::sim::ResolveGi(s, gpuInstance, info != nullptr, &inst);
    if (rc != NVML_SUCCESS) return rc;
    const auto& p = s.d.fixture.mig_profiles.at(inst.profile);
    std::memset(info, 0, sizeof *info);
    info->device = s.d.gpus[gpuInstance->gpu].get();
    info->id = inst.gi;
    info->profileId = p.id;
    info->placement = {inst.placement, p.placement_size};
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    MigInstanceState inst;
    nvmlReturn_t rc = gpulet::sim::ResolveGi(s, gpuInstance, true, &inst);
    if (rc != NVML_SUCCESS) return rc;
    return ChangeLayout(s, gpuInstance->gpu, [&](ControlState&, MigLayoutState& layout) {
      return gpulet::sim::DestroyGpuInstanceInLayout(layout, inst.gi);
    });
  });
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t* info) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    MigInstanceState inst;
    nvmlReturn_t rc = gpulet::sim::ResolveGi(s, gpuInstance, info != nullptr, &inst);
    if (rc != NVML_SUCCESS) return rc;
    if (engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED ||
        profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT) {
      return NVML_ERROR_INVALID_ARGUMENT;
    }
    const auto& p = s.d.fixture.mig_profiles.at(inst.profile);
    // Only the compute profile spanning the whole GPU instance is simulated.
    if (profile != gpulet::sim::WholeComputeProfile(p.slices)) return NVML_ERROR_NOT_SUPPORTED;
    std::memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = p.slices;
    info->instanceCount = 1;
    info->multiprocessorCount = p.sms;
    info->sharedCopyEngineCount = p.slices;
    info->sharedDecoderCount = p.slices / 2;
    info->sharedJpegCount = p.slices == 7 ? 1 : 0;
    info->sharedOfaCount = p.slices == 7 ? 1 : 0;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    nvmlComputeInstance_t* computeInstance) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    MigInstanceState inst;
    nvmlReturn_t rc = gpulet::sim::ResolveGi(s, gpuInstance, computeInstance != nullptr, &inst);
    if (rc != NVML_SUCCESS) return rc;
    unsigned ci = 0;
    rc = ChangeLayout(s, gpuInstance->gpu, [&](ControlState& st, MigLayoutState& layout) {
      if (gpulet::sim::CreateFails(st)) return static_cast<int>(NVML_ERROR_INSUFFICIENT_RESOURCES);
      return gpulet::sim::CreateComputeInstanceInLayout(s.d.fixture, layout, inst.gi, profileId,
                                                        &ci);
    });
    if (rc == NVML_SUCCESS) {
      *computeInstance = gpulet::sim::ComputeInstanceHandle(s.d, gpuInstance->gpu, inst.gi, ci);
    }
    return rc;
  });
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                           unsigned int profileId,
                                                           nvmlComputeInstance_t* computeInstances,
                                                           unsigned int* count) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    MigInstanceState inst;
    nvmlReturn_t rc = gpulet::sim::ResolveGi(
        s, gpuInstance, computeInstances != nullptr && count != nullptr, &inst);
    if (rc != NVML_SUCCESS) return rc;
    const auto& p = s.d.fixture.mig_profiles.at(inst.profile);
    std::vector<unsigned> cis;
    if (profileId == gpulet::sim::WholeComputeProfile(p.slices)) cis = inst.cis;
    if (*count < cis.size()) {
      *count = static_cast<unsigned>(cis.size());
      return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (size_t i = 0; i < cis.size(); ++i) {
      computeInstances[i] =
          gpulet::sim::ComputeInstanceHandle(s.d, gpuInstance->gpu, inst.gi, cis[i]);
    }
    *count = static_cast<unsigned>(cis.size());
    return NVML_SUCCESS;
  });
}

namespace gpulet::sim {
namespace {
// A compute instance handle naming a live compute instance of a live GPU instance.
nvmlReturn_t ResolveCi(Session& s, nvmlComputeInstance_t ci, bool outputs_ok,
                       MigInstanceState* gi) {
  if (s.rc != NVML_SUCCESS) return s.rc;
  if (ci == nullptr || !outputs_ok) return NVML_ERROR_INVALID_ARGUMENT;
  auto it = s.d.ci_handles.find({ci->gpu, ci->gi, ci->ci});
  if (it == s.d.ci_handles.end() || it->second.get() != ci) return NVML_ERROR_INVALID_ARGUMENT;
  nvmlGpuInstance_t parent = GpuInstanceHandle(s.d, ci->gpu, ci->gi);
  if (nvmlReturn_t rc = ResolveGi(s, parent, true, gi); rc != NVML_SUCCESS) return rc;
  if (std::find(gi->cis.begin(), gi->cis.end(), ci->ci) == gi->cis.end()) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  return NVML_SUCCESS;
}
}  // namespace
}  // namespace gpulet::sim

SIM_EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    MigInstanceState gi;
    nvmlReturn_t rc = gpulet::sim::ResolveCi(s, computeInstance, true, &gi);
    if (rc != NVML_SUCCESS) return rc;
    return ChangeLayout(s, computeInstance->gpu, [&](ControlState&, MigLayoutState& layout) {
      return gpulet::sim::DestroyComputeInstanceInLayout(layout, gi.gi, computeInstance->ci);
    });
  });
}

SIM_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                      nvmlComputeInstanceInfo_t* info) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    MigInstanceState gi;
    nvmlReturn_t rc = gpulet::sim::ResolveCi(s, computeInstance, info != nullptr, &gi);
    if (rc != NVML_SUCCESS) return rc;
    const auto& p = s.d.fixture.mig_profiles.at(gi.profile);
    std::memset(info, 0, sizeof *info);
    info->device = s.d.gpus[computeInstance->gpu].get();
    info->gpuInstance = gpulet::sim::GpuInstanceHandle(s.d, computeInstance->gpu, gi.gi);
    info->id = computeInstance->ci;
    info->profileId = gpulet::sim::WholeComputeProfile(p.slices);
    info->placement = {0, p.slices};
    return NVML_SUCCESS;
  });
}

// ---- Telemetry beyond the basic queries: field values, memory info v2, GPM profiling. ----
// Values follow the same generated telemetry as the basic queries, so a dashboard sees one
// consistent GPU: memory runs a few degrees cooler than the die, profiling ratios track GPU
// utilisation, DRAM activity tracks memory utilisation, link counters only grow.

struct nvmlGpmSample_st {
  bool taken = false;
  unsigned gpu = 0;
  int gpu_instance = -1;  // -1: the whole GPU
  int64_t at_ms = 0;
  unsigned gpu_util = 0;
  unsigned mem_util = 0;
  unsigned slice_share = 7;  // the instance's slices out of 7 (7 for a whole GPU)
  unsigned nvlinks = 0;
};

namespace gpulet::sim {
namespace {

unsigned NvlinksOf(const Fixture& f, const GpuSpec& g) {
  if (f.nvswitch_links > 0) return f.nvswitch_links;
  unsigned n = 0;
  if (g.index < f.nvlinks.size()) {
    for (unsigned links : f.nvlinks[g.index]) n += links;
  }
  return n;
}

// Cumulative NVLink traffic in KiB: grows with the energy counter (busy GPUs move more data).
uint64_t NvlinkKiB(const Telemetry& t, unsigned links, bool tx) {
  return links == 0 ? 0 : t.energy_mj / (tx ? 4 : 5) * links / 18;
}

bool GpmCapable(const GpuSpec& g) { return g.cc_major >= 9; }

}  // namespace
}  // namespace gpulet::sim

SIM_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                                 nvmlFieldValue_t* values) {
  return PhysicalQuery(device, values != nullptr && valuesCount >= 0,
                       [&](Session& s, const gpulet::sim::GpuSpec& g) {
                         const gpulet::sim::Telemetry now = gpulet::sim::Now(s, g);
                         const unsigned links = gpulet::sim::NvlinksOf(s.d.fixture, g);
                         for (int i = 0; i < valuesCount; ++i) {
                           nvmlFieldValue_t& v = values[i];
                           v.timestamp = gpulet::sim::WallClockMs() * 1000;
                           v.latencyUsec = 0;
                           v.nvmlReturn = NVML_SUCCESS;
                           switch (v.fieldId) {
                             case NVML_FI_DEV_MEMORY_TEMP:
                               v.valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                               v.value.uiVal = now.temperature_c > 3 ? now.temperature_c - 3 : 0;
                               break;
                             case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX:
                             case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX:
                               if (links == 0) {
                                 v.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                                 break;
                               }
                               v.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                               v.value.ullVal = gpulet::sim::NvlinkKiB(
                                   now, links, v.fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX);
                               break;
                             default:
                               v.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                           }
                         }
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  if (memory != nullptr && memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, memory != nullptr, &t); rc != NVML_SUCCESS) return rc;
    const nvmlMemory_t v1 = gpulet::sim::MemoryOf(s, t);
    // The driver keeps about 1 % of the framebuffer (at most 512 MiB) for itself.
    constexpr unsigned long long kMiB = 1024ULL * 1024ULL;
    const unsigned long long reserved = std::min(v1.total / 100, 512 * kMiB);
    memory->total = v1.total;
    memory->reserved = reserved;
    memory->used = v1.used;
    memory->free = v1.free > reserved ? v1.free - reserved : 0;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t* support) {
  if (support != nullptr && support->version != NVML_GPM_SUPPORT_VERSION) {
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  }
  return PhysicalQuery(device, support != nullptr, [&](Session&, const gpulet::sim::GpuSpec& g) {
    support->isSupportedDevice = gpulet::sim::GpmCapable(g) ? 1 : 0;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t* sample) {
  if (sample == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *sample = new nvmlGpmSample_st();
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
  if (sample == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  delete sample;
  return NVML_SUCCESS;
}

namespace {

nvmlReturn_t TakeGpmSample(nvmlDevice_t device, int gpu_instance, nvmlGpmSample_t sample) {
  return PhysicalQuery(device, sample != nullptr, [&](Session& s, const gpulet::sim::GpuSpec& g) {
    if (!gpulet::sim::GpmCapable(g)) return NVML_ERROR_NOT_SUPPORTED;
    unsigned slices = 7;
    if (gpu_instance >= 0) {
      const gpulet::sim::MigDeviceSpec* found = nullptr;
      for (const gpulet::sim::MigDeviceSpec& m : g.mig) {
        if (static_cast<int>(m.gi) == gpu_instance) found = &m;
      }
      if (found == nullptr) return NVML_ERROR_NOT_FOUND;
      slices = found->facts.slices;
    }
    const gpulet::sim::Telemetry now = gpulet::sim::Now(s, g);
    sample->taken = true;
    sample->gpu = g.index;
    sample->gpu_instance = gpu_instance;
    sample->at_ms = gpulet::sim::WallClockMs();
    sample->gpu_util = now.gpu_util;
    sample->mem_util = now.mem_util;
    sample->slice_share = slices;
    sample->nvlinks = gpulet::sim::NvlinksOf(s.d.fixture, g);
    return NVML_SUCCESS;
  });
}

}  // namespace

SIM_EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
  return TakeGpmSample(device, -1, sample);
}

SIM_EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                            nvmlGpmSample_t sample) {
  return TakeGpmSample(device, static_cast<int>(gpuInstanceId), sample);
}

SIM_EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t* metricsGet) {
  if (metricsGet == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION) {
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  }
  const nvmlGpmSample_st* a = metricsGet->sample1;
  const nvmlGpmSample_st* b = metricsGet->sample2;
  if (a == nullptr || b == nullptr || !a->taken || !b->taken || a->gpu != b->gpu ||
      a->gpu_instance != b->gpu_instance || b->at_ms < a->at_ms ||
      metricsGet->numMetrics > kNvmlGpmMetricsCapacity) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  // Interval averages: the mean of the two ends of the interval.
  const double util = (a->gpu_util + b->gpu_util) / 2.0;
  const double mem = (a->mem_util + b->mem_util) / 2.0;
  const double share = b->slice_share / 7.0;
  for (unsigned i = 0; i < metricsGet->numMetrics; ++i) {
    nvmlGpmMetric_t& m = metricsGet->metrics[i];
    m.nvmlReturn = NVML_SUCCESS;
    m.metricInfo = {nullptr, nullptr, nullptr};
    switch (m.metricId) {
      case NVML_GPM_METRIC_GRAPHICS_UTIL: m.value = util; break;
      case NVML_GPM_METRIC_SM_UTIL: m.value = util * 0.9; break;
      case NVML_GPM_METRIC_SM_OCCUPANCY: m.value = util * 0.6; break;
      case NVML_GPM_METRIC_ANY_TENSOR_UTIL: m.value = util * 0.5; break;
      case NVML_GPM_METRIC_DRAM_BW_UTIL: m.value = mem; break;
      case NVML_GPM_METRIC_FP64_UTIL: m.value = util * 0.1; break;
      case NVML_GPM_METRIC_FP32_UTIL: m.value = util * 0.3; break;
      case NVML_GPM_METRIC_FP16_UTIL: m.value = util * 0.2; break;
      case NVML_GPM_METRIC_PCIE_TX_PER_SEC: m.value = mem * 120.0 * share; break;  // MiB/s
      case NVML_GPM_METRIC_PCIE_RX_PER_SEC: m.value = mem * 160.0 * share; break;
      case NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC:
      case NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC:
        m.value = util * (m.metricId == NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC ? 900.0 : 850.0) *
                  share;
        if (b->nvlinks == 0) m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        break;
      default:
        m.value = 0;
        m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
  }
  return NVML_SUCCESS;
}
