// Internals of the simulated NVML driver shared by its parts (nvml_sim.cc: session, devices and
// events; nvml_sim_mig.cc: MIG management; nvml_sim_telemetry.cc: field values, memory v2, GPM).
// Only the library's own sources include it.
#pragma once
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
#include <optional>
#include <string>
#include <tuple>
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

inline constexpr unsigned long long kSupportedEvents =
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

  // GPULET_SIM_VISIBLE_DEVICES (see VisibleDevices): what this process's container sees. The
  // handles keep host GPU indexes, so control state and events stay the node's; only the
  // enumeration (count, handle by index, MIG devices) is restricted.
  std::optional<VisibleDevices> visible;
  unsigned VisibleCount() const {
    return visible ? static_cast<unsigned>(visible->gpus.size())
                   : static_cast<unsigned>(fixture.gpus.size());
  }
  // Host GPU index of visible index `i` (the caller checked i < VisibleCount()).
  unsigned HostIndex(unsigned i) const { return visible ? visible->gpus[i] : i; }

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

inline Driver& TheDriver() {
  static Driver driver;
  return driver;
}

// Runs an entry point's body; nothing thrown may cross the C ABI.
template <typename F>
inline nvmlReturn_t Guard(F&& body) {
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
inline nvmlReturn_t Resolve(Session& s, nvmlDevice_t device, bool outputs_ok, Target* t) {
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

inline nvmlReturn_t CopyString(const std::string& value, char* out, unsigned length) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (length < value.size() + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, value.c_str(), value.size() + 1);
  return NVML_SUCCESS;
}

inline void FillPci(const GpuSpec& g, nvmlPciInfo_t* pci) {
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

inline Telemetry Now(const Session& s, const GpuSpec& g) {
  return ComputeTelemetry(s.d.fixture, g, WallClockMs(), s.d.Overrides(g.index));
}

inline nvmlDeviceArchitecture_t ArchitectureCode(const std::string& a) {
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
inline nvmlReturn_t PhysicalQuery(nvmlDevice_t device, bool outputs_ok, F&& fill) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, outputs_ok, &t); rc != NVML_SUCCESS) return rc;
    if (t.mig != nullptr) return NVML_ERROR_NOT_SUPPORTED;
    return fill(s, *t.gpu);
  });
}

// The first queued event at or after the set's position that the set registered for.
inline bool TakeEvent(Driver& d, nvmlEventSet_st* set, nvmlEventData_t* data) {
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
inline int RawEnum(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

inline void DrainInotify(int fd) {
  alignas(inotify_event) char buf[4096];
  while (::read(fd, buf, sizeof buf) > 0) {
  }
}

// Framebuffer use of a GPU or MIG device (nvmlDeviceGetMemoryInfo and its v2).
inline nvmlMemory_t MemoryOf(const Session& s, const Target& t) {
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

using gpulet::sim::Guard;
using gpulet::sim::PhysicalQuery;
using gpulet::sim::RawEnum;
using gpulet::sim::Resolve;
using gpulet::sim::Session;
using gpulet::sim::Target;
using gpulet::sim::TheDriver;
