// The simulated driver, part 2: MIG management (nvml_sim_driver.h has the shared session).
#include "sim/nvml_sim_driver.h"

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
    MigLayoutState layout = it != st.mig.end() ? it->second : LayoutFromFixture(s.d.base_mig[gpu]);
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
using gpulet::sim::MigInstanceState;
using gpulet::sim::MigLayoutState;

SIM_EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                             nvmlReturn_t* activationStatus) {
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    const bool known = mode == NVML_DEVICE_MIG_ENABLE || mode == NVML_DEVICE_MIG_DISABLE;
    nvmlReturn_t rc =
        gpulet::sim::ResolveMigParent(s, device, activationStatus != nullptr && known, &t);
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
    nvmlReturn_t rc =
        gpulet::sim::ResolveMigParent(s, device, gpuInstances != nullptr && count != nullptr, &t);
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
    nvmlGpuInstance_t gpuInstance, unsigned int profileId, nvmlComputeInstance_t* computeInstance) {
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
