#include "mig/plan.h"

#include <algorithm>
#include <map>

namespace gpulet::mig {
namespace {

const ProfileSpec* Find(const std::vector<ProfileSpec>& profiles, const std::string& name) {
  for (const auto& p : profiles) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

unsigned Mask(const ProfileSpec& p, unsigned start) { return ((1u << p.size) - 1u) << start; }

// One instance to place: the GPU instance profile and the device name the config gave
// ("1c.3g.20gb" is placed as a 3g.20gb).
struct ToPlace {
  const ProfileSpec* spec;
  std::string device;
  bool operator==(const ToPlace&) const = default;
};

// Depth-first over the instances to place (largest first), trying each valid start.
bool Search(const std::vector<ToPlace>& to_place, size_t i, unsigned used,
            std::vector<GpuInstance>& out) {
  if (i == to_place.size()) return true;
  const ProfileSpec& p = *to_place[i].spec;
  for (unsigned start : p.starts) {
    if (start + p.size > kMemorySlices) continue;
    const unsigned m = Mask(p, start);
    if ((used & m) != 0) continue;
    // Same profile as the previous instance: only later starts (prunes symmetric orders).
    if (i > 0 && to_place[i - 1] == to_place[i] && !out.empty() && start < out.back().start)
      continue;
    out.push_back({to_place[i].device, start, std::nullopt, true});
    if (Search(to_place, i + 1, used | m, out)) return true;
    out.pop_back();
  }
  return false;
}

std::string Names(const std::vector<ProfileSpec>& profiles) {
  std::string s;
  for (const auto& p : profiles) s += (s.empty() ? "" : ", ") + p.name;
  return s.empty() ? "none" : s;
}

std::string Starts(const ProfileSpec& p) {
  std::string s;
  for (unsigned v : p.starts) s += (s.empty() ? "" : ",") + std::to_string(v);
  return s;
}

std::string GpuName(const GpuState& g) {
  return "GPU " + std::to_string(g.index) + " (" + g.name + ")";
}

}  // namespace

bool Plan::changes() const {
  return std::any_of(gpus.begin(), gpus.end(), [](const GpuPlan& g) { return g.changes(); });
}

Result<std::vector<GpuInstance>> PlaceInstances(
    const std::vector<ProfileSpec>& profiles, const std::vector<GpuInstance>& fixed,
    const std::vector<std::pair<std::string, unsigned>>& want) {
  unsigned used = 0, slices = 0, memory = 0;
  for (const auto& f : fixed) {
    const ProfileSpec* p = Find(profiles, GpuInstanceProfileOf(f.profile));
    if (p == nullptr) continue;
    used |= Mask(*p, f.start);
    slices += p->slices;
    memory += p->size;
  }
  std::vector<ToPlace> to_place;
  for (const auto& [name, count] : want) {
    const ProfileSpec* p = Find(profiles, GpuInstanceProfileOf(name));
    const std::string what = name + " x" + std::to_string(count);
    if (p == nullptr) {
      return Status(
          ErrorCode::kInvalidInput,
          what + ": profile not offered by this GPU model (profiles: " + Names(profiles) + ")");
    }
    if (count > p->starts.size()) {
      return Status(ErrorCode::kInvalidInput, what + ": at most " +
                                                  std::to_string(p->starts.size()) +
                                                  " fit (starts " + Starts(*p) + ")");
    }
    const unsigned ci_slices = ComputeSlicesOf(name);
    if (ci_slices > p->slices) {
      return Status(ErrorCode::kInvalidInput,
                    what + ": a compute instance of " + std::to_string(ci_slices) +
                        " slices does not fit a GPU instance of " + std::to_string(p->slices));
    }
    for (unsigned i = 0; i < count; ++i) to_place.push_back({p, name});
    slices += p->slices * count;
    memory += p->size * count;
    if (slices > 7) {
      return Status(ErrorCode::kInvalidInput,
                    what + ": needs " + std::to_string(slices) + " compute slices, the GPU has 7");
    }
    if (memory > kMemorySlices) {
      return Status(ErrorCode::kInvalidInput, what + ": needs " + std::to_string(memory) +
                                                  " memory slices, the GPU has " +
                                                  std::to_string(kMemorySlices) + " (" + name +
                                                  " takes " + std::to_string(p->size) + ")");
    }
  }
  std::stable_sort(to_place.begin(), to_place.end(), [](const ToPlace& x, const ToPlace& y) {
    const ProfileSpec* a = x.spec;
    const ProfileSpec* b = y.spec;
    return a->size > b->size || (a->size == b->size && a->starts.size() < b->starts.size());
  });
  std::vector<GpuInstance> out;
  if (!Search(to_place, 0, used, out)) {
    // Name the first profile that cannot be placed together with those before it.
    for (size_t n = 1; n <= to_place.size(); ++n) {
      std::vector<ToPlace> prefix(to_place.begin(), to_place.begin() + static_cast<long>(n));
      std::vector<GpuInstance> scratch;
      if (!Search(prefix, 0, used, scratch)) {
        const ProfileSpec& last = *to_place[n - 1].spec;
        return Status(ErrorCode::kInvalidInput,
                      to_place[n - 1].device + ": no valid placement left (it may start only at " +
                          Starts(last) + " and takes " + std::to_string(last.size) +
                          " memory slices; the instances placed before it cover them)");
      }
    }
    return Status(ErrorCode::kInvalidInput, "no valid placement");
  }
  std::sort(out.begin(), out.end(),
            [](const GpuInstance& a, const GpuInstance& b) { return a.start < b.start; });
  return out;
}

Result<Plan> ComputePlan(const MigConfig& config, const std::vector<GpuState>& gpus) {
  Plan plan;
  plan.config = config.name;
  std::map<unsigned, std::string> claimed_by;  // GPU index → the entry that configures it
  for (const MigConfigEntry& e : config.entries) {
    const std::string where = config.file + ":" + std::to_string(e.line) + ": " + e.field;
    std::vector<unsigned> targets;
    if (e.devices) {
      for (unsigned d : *e.devices) {
        if (d >= gpus.size()) {
          return Status(ErrorCode::kInvalidInput, where + ".devices: GPU " + std::to_string(d) +
                                                      " does not exist (" +
                                                      std::to_string(gpus.size()) + " GPUs)");
        }
        targets.push_back(d);
      }
    } else {
      for (const auto& g : gpus) targets.push_back(g.index);
    }
    for (unsigned index : targets) {
      const GpuState& g = gpus[index];
      if (!e.device_filter.empty() &&
          !std::binary_search(e.device_filter.begin(), e.device_filter.end(), g.pci_device_id)) {
        continue;  // meant for another GPU model
      }
      if (auto [it, fresh] = claimed_by.emplace(index, e.field); !fresh) {
        return Status(ErrorCode::kInvalidInput,
                      where + ": " + GpuName(g) + " is configured by " + it->second + " too");
      }
      GpuPlan p;
      p.index = g.index;
      p.name = g.name;
      p.mig_before = g.mig_enabled;
      if (!g.mig_capable) {
        if (e.mig_enabled) {
          return Status(ErrorCode::kInvalidInput,
                        where + ".mig-enabled: " + GpuName(g) + " does not support MIG");
        }
        continue;  // mig-enabled: false on a GPU without MIG: nothing to do
      }
      p.mig_after = e.mig_enabled;
      const std::vector<GpuInstance> current =
          g.mig_enabled ? g.instances : std::vector<GpuInstance>{};
      if (!e.mig_enabled) {
        p.destroy = current;
        plan.gpus.push_back(std::move(p));
        continue;
      }
      // Keep matching instances where the rest still fits; else lay the GPU out afresh.
      std::vector<GpuInstance> keep;
      std::vector<std::pair<std::string, unsigned>> rest;
      for (const auto& [profile, count] : e.mig_devices) {
        unsigned kept = 0;
        for (const auto& c : current) {
          if (kept < count && c.profile == profile && c.whole_ci) {
            keep.push_back(c);
            ++kept;
          }
        }
        if (kept < count) rest.emplace_back(profile, count - kept);
      }
      Result<std::vector<GpuInstance>> placed = PlaceInstances(g.profiles, keep, rest);
      if (!placed.ok() && !keep.empty()) {
        keep.clear();
        placed = PlaceInstances(g.profiles, {}, e.mig_devices);
      }
      if (!placed.ok()) {
        std::string why = placed.status().message();
        if (g.profiles.empty()) {
          why +=
              "; the driver listed no MIG profiles for this GPU (some drivers list them only "
              "with MIG enabled: apply a config with mig-enabled: true and no mig-devices "
              "first)";
        }
        return Status(ErrorCode::kInvalidInput,
                      config.file + ":" + std::to_string(e.mig_devices_line) + ": " + e.field +
                          ".mig-devices: " + GpuName(g) + ": " + why);
      }
      p.keep = keep;
      p.create = *placed;
      for (const auto& c : current) {
        if (std::find(keep.begin(), keep.end(), c) == keep.end()) p.destroy.push_back(c);
      }
      plan.gpus.push_back(std::move(p));
    }
  }
  std::sort(plan.gpus.begin(), plan.gpus.end(),
            [](const GpuPlan& a, const GpuPlan& b) { return a.index < b.index; });
  return plan;
}

namespace {
nlohmann::json InstancesJson(const std::vector<GpuInstance>& list) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& i : list) {
    nlohmann::json j = {{"profile", i.profile}, {"start", i.start}};
    if (i.gi) j["gpu_instance_id"] = *i.gi;
    out.push_back(j);
  }
  return out;
}

std::string Describe(const GpuInstance& i) {
  std::string s = i.profile + "@" + std::to_string(i.start);
  if (i.gi) s += " (GI " + std::to_string(*i.gi) + ")";
  return s;
}
}  // namespace

nlohmann::json PlanToJson(const Plan& plan) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const GpuPlan& g : plan.gpus) {
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"mig_enabled_before", g.mig_before},
                    {"mig_enabled_after", g.mig_after},
                    {"changes", g.changes()},
                    {"keep", InstancesJson(g.keep)},
                    {"destroy", InstancesJson(g.destroy)},
                    {"create", InstancesJson(g.create)}});
  }
  return {{"config", plan.config}, {"changes", plan.changes()}, {"gpus", gpus}};
}

std::string PlanToText(const Plan& plan) {
  std::string out = "MIG config \"" + plan.config +
                    "\": " + (plan.changes() ? "changes needed" : "nothing to change") + "\n";
  for (const GpuPlan& g : plan.gpus) {
    out += "GPU " + std::to_string(g.index) + " (" + g.name + "): ";
    if (!g.changes()) {
      out += "unchanged (MIG " + std::string(g.mig_after ? "enabled" : "disabled") + ", " +
             std::to_string(g.keep.size()) + " instances)\n";
      continue;
    }
    if (g.mig_before != g.mig_after) out += g.mig_after ? "enable MIG; " : "disable MIG; ";
    out += "keep " + std::to_string(g.keep.size()) + ", destroy " +
           std::to_string(g.destroy.size()) + ", create " + std::to_string(g.create.size()) + "\n";
    for (const auto& i : g.destroy) out += "  - destroy " + Describe(i) + "\n";
    for (const auto& i : g.create) out += "  + create  " + Describe(i) + "\n";
    for (const auto& i : g.keep) out += "  = keep    " + Describe(i) + "\n";
  }
  return out;
}

}  // namespace gpulet::mig
