#include "mig/driver.h"

#include <algorithm>
#include <map>

#include "gpu/mig_profiles.h"

namespace gpulet::mig {
namespace {

constexpr unsigned kMaxInstances = 8;

using gpu::WholeComputeProfile;

class Session {
 public:
  explicit Session(const gpu::Nvml& nvml) : nvml_(nvml), f_(nvml.fn()) {}

  Status CheckSymbols() const {
    const std::pair<const char*, const void*> needed[] = {
        {"nvmlDeviceGetMigMode", reinterpret_cast<const void*>(f_.nvmlDeviceGetMigMode)},
        {"nvmlDeviceSetMigMode", reinterpret_cast<const void*>(f_.nvmlDeviceSetMigMode)},
        {"nvmlDeviceGetGpuInstanceProfileInfo",
         reinterpret_cast<const void*>(f_.nvmlDeviceGetGpuInstanceProfileInfo)},
        {"nvmlDeviceGetGpuInstancePossiblePlacements_v2",
         reinterpret_cast<const void*>(f_.nvmlDeviceGetGpuInstancePossiblePlacements_v2)},
        {"nvmlDeviceCreateGpuInstanceWithPlacement",
         reinterpret_cast<const void*>(f_.nvmlDeviceCreateGpuInstanceWithPlacement)},
        {"nvmlDeviceGetGpuInstances", reinterpret_cast<const void*>(f_.nvmlDeviceGetGpuInstances)},
        {"nvmlGpuInstanceGetInfo", reinterpret_cast<const void*>(f_.nvmlGpuInstanceGetInfo)},
        {"nvmlGpuInstanceDestroy", reinterpret_cast<const void*>(f_.nvmlGpuInstanceDestroy)},
        {"nvmlGpuInstanceCreateComputeInstance",
         reinterpret_cast<const void*>(f_.nvmlGpuInstanceCreateComputeInstance)},
        {"nvmlGpuInstanceGetComputeInstances",
         reinterpret_cast<const void*>(f_.nvmlGpuInstanceGetComputeInstances)},
        {"nvmlComputeInstanceDestroy",
         reinterpret_cast<const void*>(f_.nvmlComputeInstanceDestroy)},
    };
    for (const auto& [name, fn] : needed) {
      if (fn == nullptr) {
        return Status(ErrorCode::kNvmlSymbolMissing,
                      nvml_.library_path() + ": lacks " + name + " (needed for MIG management)");
      }
    }
    return Status::Ok();
  }

  Status Error(nvmlReturn_t rc, const std::string& what) const {
    return Status(rc == NVML_ERROR_GPU_IS_LOST ? ErrorCode::kGpuLost : ErrorCode::kNvmlError,
                  what + ": " + nvml_.ErrorText(rc));
  }

  Result<nvmlDevice_t> Device(unsigned index) const {
    nvmlDevice_t dev = nullptr;
    nvmlReturn_t rc = f_.nvmlDeviceGetHandleByIndex_v2(index, &dev);
    if (rc != NVML_SUCCESS) return Error(rc, "GPU " + std::to_string(index) + ": handle");
    return dev;
  }

  // Profiles the GPU offers, each with its placements.
  Result<std::vector<ProfileSpec>> Profiles(nvmlDevice_t dev, const std::string& who) const {
    std::vector<ProfileSpec> out;
    for (unsigned id = 0; id < NVML_GPU_INSTANCE_PROFILE_COUNT; ++id) {
      nvmlGpuInstanceProfileInfo_t info{};
      nvmlReturn_t rc = f_.nvmlDeviceGetGpuInstanceProfileInfo(dev, id, &info);
      if (rc == NVML_ERROR_NOT_SUPPORTED || rc == NVML_ERROR_INVALID_ARGUMENT) continue;
      if (rc != NVML_SUCCESS) return Error(rc, who + ": nvmlDeviceGetGpuInstanceProfileInfo");
      ProfileSpec p;
      p.id = info.id;
      p.slices = info.sliceCount;
      p.memory_mb = info.memorySizeMB;
      p.name = ProfileName(info.sliceCount, info.memorySizeMB);
      // The REV1 profiles are the media-extension variants mig-parted names "+me".
      if (id == NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 ||
          id == NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1) {
        p.name += "+me";
      }
      nvmlGpuInstancePlacement_t placements[kMaxInstances] = {};
      unsigned count = kMaxInstances;
      rc = f_.nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, info.id, placements, &count);
      if (rc != NVML_SUCCESS) {
        return Error(rc, who + ": nvmlDeviceGetGpuInstancePossiblePlacements_v2(" + p.name + ")");
      }
      for (unsigned i = 0; i < count; ++i) {
        p.starts.push_back(placements[i].start);
        p.size = placements[i].size;
      }
      out.push_back(std::move(p));
    }
    return out;
  }

  // GPU instances of one profile.
  Result<std::vector<nvmlGpuInstance_t>> GpuInstances(nvmlDevice_t dev, unsigned profile_id,
                                                      const std::string& who) const {
    nvmlGpuInstance_t list[kMaxInstances] = {};
    unsigned count = kMaxInstances;
    nvmlReturn_t rc = f_.nvmlDeviceGetGpuInstances(dev, profile_id, list, &count);
    if (rc == NVML_ERROR_NOT_SUPPORTED) return std::vector<nvmlGpuInstance_t>{};
    if (rc != NVML_SUCCESS) return Error(rc, who + ": nvmlDeviceGetGpuInstances");
    return std::vector<nvmlGpuInstance_t>(list, list + count);
  }

  // Every compute instance of a GPU instance, over all compute profiles.
  Result<std::vector<nvmlComputeInstance_t>> ComputeInstances(nvmlGpuInstance_t gi,
                                                              const std::string& who) const {
    std::vector<nvmlComputeInstance_t> out;
    for (unsigned id = 0; id < NVML_COMPUTE_INSTANCE_PROFILE_COUNT; ++id) {
      nvmlComputeInstance_t list[kMaxInstances] = {};
      unsigned count = kMaxInstances;
      nvmlReturn_t rc = f_.nvmlGpuInstanceGetComputeInstances(gi, id, list, &count);
      if (rc == NVML_ERROR_NOT_SUPPORTED || rc == NVML_ERROR_INVALID_ARGUMENT) continue;
      if (rc != NVML_SUCCESS) return Error(rc, who + ": nvmlGpuInstanceGetComputeInstances");
      for (unsigned i = 0; i < count; ++i) {
        if (std::find(out.begin(), out.end(), list[i]) == out.end()) out.push_back(list[i]);
      }
    }
    return out;
  }

  Result<std::vector<GpuInstance>> Instances(nvmlDevice_t dev,
                                             const std::vector<ProfileSpec>& profiles,
                                             const std::string& who) const {
    std::vector<GpuInstance> out;
    for (const ProfileSpec& p : profiles) {
      Result<std::vector<nvmlGpuInstance_t>> gis = GpuInstances(dev, p.id, who);
      if (!gis.ok()) return gis.status();
      for (nvmlGpuInstance_t gi : *gis) {
        nvmlGpuInstanceInfo_t info{};
        nvmlReturn_t rc = f_.nvmlGpuInstanceGetInfo(gi, &info);
        if (rc != NVML_SUCCESS) return Error(rc, who + ": nvmlGpuInstanceGetInfo");
        Result<std::vector<nvmlComputeInstance_t>> cis = ComputeInstances(gi, who);
        if (!cis.ok()) return cis.status();
        // One compute instance: spanning the GPU instance ("3g.20gb"), or smaller ("1c.3g.20gb").
        std::string name = p.name;
        bool single_ci = false;
        if (cis->size() == 1) {
          for (unsigned slices : {p.slices, 1u, 2u, 3u, 4u, 6u, 7u, 8u}) {
            if (slices > p.slices) continue;
            nvmlComputeInstance_t one[kMaxInstances] = {};
            unsigned n = kMaxInstances;
            rc = f_.nvmlGpuInstanceGetComputeInstances(gi, WholeComputeProfile(slices), one, &n);
            if (rc == NVML_SUCCESS && n == 1) {
              single_ci = true;
              if (slices != p.slices) name = std::to_string(slices) + "c." + p.name;
              break;
            }
          }
        }
        out.push_back({name, info.placement.start, info.id, single_ci});
      }
    }
    std::sort(out.begin(), out.end(),
              [](const GpuInstance& a, const GpuInstance& b) { return a.start < b.start; });
    return out;
  }

  // The live GPU instance with id `gi` (of profile `profile_id`).
  Result<nvmlGpuInstance_t> FindGpuInstance(nvmlDevice_t dev, unsigned profile_id, unsigned gi,
                                            const std::string& who) const {
    Result<std::vector<nvmlGpuInstance_t>> gis = GpuInstances(dev, profile_id, who);
    if (!gis.ok()) return gis.status();
    for (nvmlGpuInstance_t h : *gis) {
      nvmlGpuInstanceInfo_t info{};
      if (f_.nvmlGpuInstanceGetInfo(h, &info) == NVML_SUCCESS && info.id == gi) return h;
    }
    return Status(ErrorCode::kNvmlError, who + ": GPU instance " + std::to_string(gi) + " is gone");
  }

  Status SetMode(nvmlDevice_t dev, bool enable, const std::string& who) const {
    nvmlReturn_t activation = NVML_SUCCESS;
    nvmlReturn_t rc = f_.nvmlDeviceSetMigMode(
        dev, enable ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE, &activation);
    if (rc != NVML_SUCCESS) {
      return Error(rc, who + (enable ? ": enabling MIG" : ": disabling MIG"));
    }
    if (activation != NVML_SUCCESS) {
      return Error(activation, who + ": MIG mode change pending (a GPU reset is required)");
    }
    return Status::Ok();
  }

  Status Destroy(nvmlDevice_t dev, const ProfileSpec& p, unsigned gi_id,
                 const std::string& who) const {
    Result<nvmlGpuInstance_t> gi = FindGpuInstance(dev, p.id, gi_id, who);
    if (!gi.ok()) return gi.status();
    Result<std::vector<nvmlComputeInstance_t>> cis = ComputeInstances(*gi, who);
    if (!cis.ok()) return cis.status();
    const std::string what = who + ": destroying " + p.name + " GI " + std::to_string(gi_id);
    for (nvmlComputeInstance_t ci : *cis) {
      nvmlReturn_t rc = f_.nvmlComputeInstanceDestroy(ci);
      if (rc != NVML_SUCCESS) return Error(rc, what + " (compute instance)");
    }
    nvmlReturn_t rc = f_.nvmlGpuInstanceDestroy(*gi);
    if (rc != NVML_SUCCESS) return Error(rc, what);
    return Status::Ok();
  }

  // Creates a GPU instance at `start` with one compute instance of `ci_slices` slices (0: one
  // spanning it); *gi_id receives its id (set as soon as the GPU instance exists, so a caller
  // can undo a half creation).
  Status Create(nvmlDevice_t dev, const ProfileSpec& p, unsigned start, unsigned ci_slices,
                std::optional<unsigned>* gi_id, const std::string& who) const {
    const std::string what =
        who + ": creating " + p.name + " at memory slice " + std::to_string(start);
    nvmlGpuInstancePlacement_t placement{start, p.size};
    nvmlGpuInstance_t gi = nullptr;
    nvmlReturn_t rc = f_.nvmlDeviceCreateGpuInstanceWithPlacement(dev, p.id, &placement, &gi);
    if (rc != NVML_SUCCESS) return Error(rc, what + " (GPU instance)");
    nvmlGpuInstanceInfo_t info{};
    rc = f_.nvmlGpuInstanceGetInfo(gi, &info);
    if (rc != NVML_SUCCESS) return Error(rc, what + ": nvmlGpuInstanceGetInfo");
    *gi_id = info.id;
    nvmlComputeInstance_t ci = nullptr;
    rc = f_.nvmlGpuInstanceCreateComputeInstance(
        gi, WholeComputeProfile(ci_slices != 0 ? ci_slices : p.slices), &ci);
    if (rc != NVML_SUCCESS) return Error(rc, what + " (compute instance)");
    return Status::Ok();
  }

  const gpu::Nvml& nvml_;
  const gpu::NvmlFunctions& f_;
};

// `name` is a device name: "1c.3g.20gb" finds the 3g.20gb profile.
const ProfileSpec* FindProfile(const GpuState& g, const std::string& name) {
  const std::string gi_name = GpuInstanceProfileOf(name);
  for (const auto& p : g.profiles) {
    if (p.name == gi_name) return &p;
  }
  return nullptr;
}

std::string Who(const GpuPlan& g) { return "GPU " + std::to_string(g.index) + " (" + g.name + ")"; }

std::string Describe(const GpuInstance& i) {
  std::string s = i.profile + "@" + std::to_string(i.start);
  if (i.gi) s += " (GI " + std::to_string(*i.gi) + ")";
  return s;
}

}  // namespace

std::string ProfileName(unsigned slices, unsigned long long memory_mb) {
  return std::to_string(slices) + "g." + std::to_string((memory_mb + 1023) / 1024) + "gb";
}

Result<std::vector<GpuState>> ReadMigState(const gpu::Nvml& nvml) {
  Session s(nvml);
  if (Status st = s.CheckSymbols(); !st.ok()) return st;
  const auto& f = nvml.fn();
  unsigned count = 0;
  nvmlReturn_t rc = f.nvmlDeviceGetCount_v2(&count);
  if (rc != NVML_SUCCESS) return s.Error(rc, "nvmlDeviceGetCount_v2");
  std::vector<GpuState> out;
  for (unsigned i = 0; i < count; ++i) {
    Result<nvmlDevice_t> dev = s.Device(i);
    if (!dev.ok()) return dev.status();
    GpuState g;
    g.index = i;
    char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (f.nvmlDeviceGetName(*dev, buf, sizeof buf) == NVML_SUCCESS) g.name = buf;
    if (f.nvmlDeviceGetUUID(*dev, buf, sizeof buf) == NVML_SUCCESS) g.uuid = buf;
    nvmlPciInfo_t pci{};
    if (f.nvmlDeviceGetPciInfo_v3(*dev, &pci) == NVML_SUCCESS) g.pci_device_id = pci.pciDeviceId;
    const std::string who = "GPU " + std::to_string(i) + " (" + g.name + ")";
    unsigned current = 0, pending = 0;
    rc = f.nvmlDeviceGetMigMode(*dev, &current, &pending);
    if (rc == NVML_ERROR_NOT_SUPPORTED) {
      out.push_back(std::move(g));
      continue;
    }
    if (rc != NVML_SUCCESS) return s.Error(rc, who + ": nvmlDeviceGetMigMode");
    g.mig_capable = true;
    g.mig_enabled = current == NVML_DEVICE_MIG_ENABLE;
    Result<std::vector<ProfileSpec>> profiles = s.Profiles(*dev, who);
    if (!profiles.ok()) return profiles.status();
    g.profiles = std::move(profiles).value();
    if (g.mig_enabled) {
      Result<std::vector<GpuInstance>> instances = s.Instances(*dev, g.profiles, who);
      if (!instances.ok()) return instances.status();
      g.instances = std::move(instances).value();
    }
    out.push_back(std::move(g));
  }
  return out;
}

Status ApplyPlan(const gpu::Nvml& nvml, const Plan& plan,
                 const std::function<void(const std::string&)>& progress) {
  Session s(nvml);
  if (Status st = s.CheckSymbols(); !st.ok()) return st;
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  Result<std::vector<GpuState>> state = ReadMigState(nvml);
  if (!state.ok()) return state.status();
  for (const GpuPlan& g : plan.gpus) {
    if (!g.changes()) continue;
    const std::string who = Who(g);
    const GpuState& before = (*state)[g.index];
    Result<nvmlDevice_t> dev = s.Device(g.index);
    if (!dev.ok()) return dev.status();

    // What this GPU went through, for the rollback.
    bool enabled_here = false;
    std::vector<GpuInstance> destroyed;
    std::vector<GpuInstance> created;  // gi set once the GPU instance exists
    Status failure;

    auto run = [&]() -> Status {
      if (g.mig_after && !g.mig_before) {
        if (Status st = s.SetMode(*dev, true, who); !st.ok()) return st;
        enabled_here = true;
        say(who + ": MIG enabled");
      }
      for (const GpuInstance& d : g.destroy) {
        const ProfileSpec* p = FindProfile(before, d.profile);
        if (p == nullptr || !d.gi)
          return Status(ErrorCode::kInternal, who + ": unknown instance " + d.profile);
        if (Status st = s.Destroy(*dev, *p, *d.gi, who); !st.ok()) return st;
        destroyed.push_back(d);
        say(who + ": destroyed " + Describe(d));
      }
      for (const GpuInstance& c : g.create) {
        const ProfileSpec* p = FindProfile(before, c.profile);
        if (p == nullptr)
          return Status(ErrorCode::kInternal, who + ": unknown profile " + c.profile);
        GpuInstance made = c;
        Status st = s.Create(*dev, *p, c.start, ComputeSlicesOf(c.profile), &made.gi, who);
        if (made.gi) created.push_back(made);
        if (!st.ok()) return st;
        say(who + ": created " + Describe(made));
      }
      if (!g.mig_after && g.mig_before) {
        if (Status st = s.SetMode(*dev, false, who); !st.ok()) return st;
        say(who + ": MIG disabled");
      }
      return Status::Ok();
    };
    failure = run();
    if (failure.ok()) continue;

    // Roll this GPU back: undo creations, recreate what was destroyed, restore the mode.
    std::string rollback_error;
    for (auto it = created.rbegin(); it != created.rend(); ++it) {
      const ProfileSpec* p = FindProfile(before, it->profile);
      if (Status st = s.Destroy(*dev, *p, *it->gi, who); !st.ok() && rollback_error.empty()) {
        rollback_error = st.message();
      }
    }
    for (const GpuInstance& d : destroyed) {
      const ProfileSpec* p = FindProfile(before, d.profile);
      std::optional<unsigned> gi;
      if (Status st = s.Create(*dev, *p, d.start, ComputeSlicesOf(d.profile), &gi, who);
          !st.ok() && rollback_error.empty()) {
        rollback_error = st.message();
      }
    }
    if (enabled_here && rollback_error.empty()) {
      if (Status st = s.SetMode(*dev, false, who); !st.ok()) rollback_error = st.message();
    }
    std::string message = failure.message();
    if (rollback_error.empty()) {
      message += "; " + who + " rolled back to its previous MIG layout";
    } else {
      message += "; rollback failed (" + rollback_error + "): " + who +
                 " is partly applied, run the same `gpulet mig apply` again to converge";
    }
    return Status(failure.code(), message);
  }
  return Status::Ok();
}

}  // namespace gpulet::mig
