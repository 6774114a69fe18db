#include "sim/mig_layout.h"

#include <algorithm>
#include <map>

#include "gpu/mig_profiles.h"
#include "gpu/nvml_api.h"

namespace gpulet::sim {
namespace {

const MigProfile* FindProfileByName(const Fixture& fixture, const std::string& name) {
  auto it = fixture.mig_profiles.find(name);
  return it == fixture.mig_profiles.end() ? nullptr : &it->second;
}

// GPU instance id for a profile at a placement: the id ranges the A100 driver uses per size.
unsigned GpuInstanceIdFor(const MigProfile& p, unsigned start) {
  switch (p.slices) {
    case 7:
    case 6:
      return 0;
    case 4:
      return 1;
    case 3:
      return 1 + start / 4;
    case 2:
      return 3 + start / 2;
    default:
      return 7 + start;
  }
}

MigInstanceState* FindInstance(MigLayoutState& layout, unsigned gi) {
  for (auto& i : layout.instances) {
    if (i.gi == gi) return &i;
  }
  return nullptr;
}

}  // namespace

MigLayoutState LayoutFromFixture(const std::vector<MigDeviceSpec>& mig) {
  MigLayoutState layout;
  layout.enabled = !mig.empty();
  std::map<unsigned, MigInstanceState> by_gi;
  for (const MigDeviceSpec& m : mig) {
    MigInstanceState& i = by_gi[m.gi];
    i.gi = m.gi;
    i.profile = m.profile;
    i.placement = m.placement;
    i.cis.push_back(m.ci);
  }
  for (auto& [gi, i] : by_gi) layout.instances.push_back(std::move(i));
  return layout;
}

const MigProfile* FindMigProfileById(const Fixture& fixture, unsigned id, std::string* name) {
  for (const auto& [n, p] : fixture.mig_profiles) {
    if (p.id != id) continue;
    if (name != nullptr) *name = n;
    return &p;
  }
  return nullptr;
}

unsigned ComputeProfileSlices(unsigned ci_profile) {
  switch (ci_profile) {
    case NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE:
    case NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1:
      return 1;
    case NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE:
      return 2;
    case NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE:
      return 3;
    case NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE:
      return 4;
    case NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE:
      return 6;
    case NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE:
      return 7;
    case NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE:
      return 8;
    default:
      return 0;
  }
}

unsigned WholeComputeProfile(unsigned slices) { return gpu::WholeComputeProfile(slices); }

std::vector<MigDeviceSpec> MigDevicesOf(const Fixture& fixture, const GpuSpec& gpu,
                                        const std::vector<MigDeviceSpec>& base,
                                        const MigLayoutState& layout) {
  std::vector<MigDeviceSpec> out;
  std::vector<const MigInstanceState*> sorted;
  for (const auto& i : layout.instances) sorted.push_back(&i);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->gi < b->gi; });
  for (const MigInstanceState* i : sorted) {
    const MigProfile* p = FindProfileByName(fixture, i->profile);
    if (p == nullptr) continue;  // a hand-edited control file naming an unknown profile
    std::vector<unsigned> cis = i->cis;
    std::sort(cis.begin(), cis.end());
    for (unsigned ci : cis) {
      MigDeviceSpec m;
      m.profile = i->profile;
      m.gi = i->gi;
      m.ci = ci;
      m.placement = i->placement;
      m.facts = *p;
      m.uuid = DerivedMigUuid(gpu.uuid, m.gi, m.ci);
      for (const MigDeviceSpec& b : base) {
        if (b.gi == m.gi && b.ci == m.ci && b.profile == m.profile) m.uuid = b.uuid;
      }
      out.push_back(std::move(m));
    }
  }
  return out;
}

int SetMigModeInLayout(const GpuSpec& gpu, MigLayoutState& layout, bool enable) {
  if (!gpu.mig_capable) return NVML_ERROR_NOT_SUPPORTED;
  if (!enable && !layout.instances.empty()) return NVML_ERROR_IN_USE;
  layout.enabled = enable;
  return NVML_SUCCESS;
}

int CreateGpuInstanceInLayout(const Fixture& fixture, MigLayoutState& layout, unsigned profile_id,
                              unsigned start, unsigned* gi) {
  std::string name;
  const MigProfile* p = FindMigProfileById(fixture, profile_id, &name);
  if (p == nullptr) return NVML_ERROR_NOT_SUPPORTED;
  if (!layout.enabled) return NVML_ERROR_INVALID_STATE;
  if (std::find(p->placements.begin(), p->placements.end(), start) == p->placements.end()) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  const unsigned end = start + p->placement_size;
  for (const auto& i : layout.instances) {
    const MigProfile* q = FindProfileByName(fixture, i.profile);
    if (q == nullptr) continue;
    const unsigned qend = i.placement + q->placement_size;
    if (start < qend && i.placement < end) return NVML_ERROR_INSUFFICIENT_RESOURCES;
  }
  unsigned id = GpuInstanceIdFor(*p, start);
  auto taken = [&](unsigned candidate) {
    return std::any_of(layout.instances.begin(), layout.instances.end(),
                       [&](const auto& i) { return i.gi == candidate; });
  };
  for (unsigned candidate = 1; taken(id) && candidate < 15; ++candidate) id = candidate;
  if (taken(id)) return NVML_ERROR_INSUFFICIENT_RESOURCES;
  MigInstanceState created;
  created.gi = id;
  created.profile = name;
  created.placement = start;
  layout.instances.push_back(created);
  std::sort(layout.instances.begin(), layout.instances.end(),
            [](const auto& a, const auto& b) { return a.gi < b.gi; });
  *gi = id;
  return NVML_SUCCESS;
}

int DestroyGpuInstanceInLayout(MigLayoutState& layout, unsigned gi) {
  auto it = std::find_if(layout.instances.begin(), layout.instances.end(),
                         [&](const auto& i) { return i.gi == gi; });
  if (it == layout.instances.end()) return NVML_ERROR_INVALID_ARGUMENT;
  if (!it->cis.empty()) return NVML_ERROR_IN_USE;
  layout.instances.erase(it);
  return NVML_SUCCESS;
}

int CreateComputeInstanceInLayout(const Fixture& fixture, MigLayoutState& layout, unsigned gi,
                                  unsigned ci_profile, unsigned* ci) {
  MigInstanceState* i = FindInstance(layout, gi);
  if (i == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const MigProfile* p = FindProfileByName(fixture, i->profile);
  const unsigned slices = ComputeProfileSlices(ci_profile);
  if (p == nullptr || slices == 0) return NVML_ERROR_INVALID_ARGUMENT;
  if (slices != p->slices || ci_profile != WholeComputeProfile(p->slices)) {
    return NVML_ERROR_NOT_SUPPORTED;
  }
  if (!i->cis.empty()) return NVML_ERROR_INSUFFICIENT_RESOURCES;
  i->cis.push_back(0);
  *ci = 0;
  return NVML_SUCCESS;
}

int DestroyComputeInstanceInLayout(MigLayoutState& layout, unsigned gi, unsigned ci) {
  MigInstanceState* i = FindInstance(layout, gi);
  if (i == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  auto it = std::find(i->cis.begin(), i->cis.end(), ci);
  if (it == i->cis.end()) return NVML_ERROR_INVALID_ARGUMENT;
  i->cis.erase(it);
  return NVML_SUCCESS;
}

}  // namespace gpulet::sim
