#include "sharing/plan.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

namespace gpulet::sharing {

const AdvertisedDevice* Resource::Find(const std::string& id) const {
  for (const AdvertisedDevice& d : devices) {
    if (d.id == id) return &d;
  }
  return nullptr;
}

const Resource* Plan::Find(const std::string& name) const {
  for (const Resource& r : resources) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

const char* SharingKindName(SharingKind k) {
  switch (k) {
    case SharingKind::kNone:
      return "none";
    case SharingKind::kTimeSlicing:
      return "time-slicing";
    case SharingKind::kMps:
      return "mps";
    case SharingKind::kMemory:
      return "memory";
  }
  return "none";
}

std::string SocketNameFor(const std::string& resource_name) {
  // "<domain>/<name>": the domain's first label names the vendor, the name keeps its dots.
  const size_t slash = resource_name.find('/');
  if (slash == std::string::npos) return resource_name + ".sock";
  const std::string domain = resource_name.substr(0, slash);
  return domain.substr(0, domain.find('.')) + "-" + resource_name.substr(slash + 1) + ".sock";
}

std::string MigResourceName(const std::string& profile) {
  std::string p = profile;
  std::replace(p.begin(), p.end(), '+', '.');
  return "nvidia.com/mig-" + p;
}

std::string BaseDeviceId(const std::string& id) {
  const size_t sep = id.rfind("::");
  return sep == std::string::npos ? id : id.substr(0, sep);
}

std::string MemoryUnitId(const std::string& gpu_uuid, int k) {
  return gpu_uuid + "::mem-" + std::to_string(k);
}

int MpsClientLimit(int cc_major, int cc_minor) {
  // The contract gpulet documents (docs/sharing.md): 48 clients from compute capability 7.5, 16
  // on older parts.
  return (cc_major > 7 || (cc_major == 7 && cc_minor >= 5)) ? 48 : 16;
}

namespace {

constexpr char kGpuResource[] = "nvidia.com/gpu";

AdvertisedDevice WholeGpu(const gpu::Gpu& g) {
  AdvertisedDevice d;
  d.id = g.uuid;
  d.gpu_index = g.index;
  d.uuid = g.uuid;
  d.index = std::to_string(g.index);
  d.numa_node = g.numa_node;
  return d;
}

AdvertisedDevice MigBacked(const gpu::Gpu& g, const gpu::MigDevice& m) {
  AdvertisedDevice d;
  d.id = m.uuid;
  d.gpu_index = g.index;
  d.mig_index = m.mig_index;
  d.uuid = m.uuid;
  d.parent_uuid = g.uuid;
  d.index = std::to_string(g.index) + ":" + std::to_string(m.mig_index);
  d.numa_node = g.numa_node;
  return d;
}

config::SourceLocation Sub(const config::SourceLocation& where, const std::string& suffix) {
  config::SourceLocation l = where;
  l.field += suffix;
  return l;
}

std::string Quote(const std::string& s) { return "\"" + s + "\""; }

std::string IndexList(const std::vector<unsigned>& v) {
  std::string out;
  for (unsigned i : v) out += (out.empty() ? "" : ",") + std::to_string(i);
  return out;
}

std::optional<unsigned> ParseIndex(std::string_view s) {
  unsigned v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// flags.migStrategy errors: the flag may come from the file or the command line.
Status MigError(const config::Config& cfg, const std::string& problem) {
  return Status(ErrorCode::kInvalidInput,
                (cfg.source.empty() ? "" : cfg.source + ": ") + "flags.migStrategy: " + problem);
}

using BaseResources = std::map<std::string, std::vector<AdvertisedDevice>>;

Result<BaseResources> BaseFromMig(const std::vector<const gpu::Gpu*>& gpus,
                                  const config::Config& cfg, config::MigStrategy mig) {
  BaseResources base;
  if (mig == config::MigStrategy::kNone) {
    for (const gpu::Gpu* g : gpus) base[kGpuResource].push_back(WholeGpu(*g));
    return base;
  }
  auto mig_devices = [](const gpu::Gpu& g) {
    std::vector<const gpu::MigDevice*> out;
    for (const gpu::MigDevice& m : g.mig_devices) out.push_back(&m);
    std::sort(out.begin(), out.end(), [](const gpu::MigDevice* a, const gpu::MigDevice* b) {
      return a->mig_index < b->mig_index;
    });
    return out;
  };
  if (mig == config::MigStrategy::kSingle) {
    std::vector<unsigned> enabled, disabled;
    std::map<std::string, std::vector<unsigned>> profiles;  // profile → GPUs that have it
    for (const gpu::Gpu* g : gpus) {
      (g->mig_enabled ? enabled : disabled).push_back(g->index);
      for (const gpu::MigDevice& m : g->mig_devices) {
        std::vector<unsigned>& on = profiles[m.profile];
        if (on.empty() || on.back() != g->index) on.push_back(g->index);
      }
    }
    if (enabled.empty()) {
      for (const gpu::Gpu* g : gpus) base[kGpuResource].push_back(WholeGpu(*g));
      return base;
    }
    if (!disabled.empty()) {
      return MigError(cfg, "single needs MIG enabled on every GPU or on none; enabled on GPU " +
                               IndexList(enabled) + ", disabled on GPU " + IndexList(disabled) +
                               " (use mixed, or change the MIG mode)");
    }
    if (profiles.size() > 1) {
      std::string found;
      for (const auto& [p, on] : profiles) {
        found += (found.empty() ? "" : ", ") + p + " (GPU " + IndexList(on) + ")";
      }
      return MigError(cfg, "single needs every MIG device to have the same profile, found " +
                               found + " (use mixed, or repartition)");
    }
    for (const gpu::Gpu* g : gpus) {
      for (const gpu::MigDevice* m : mig_devices(*g)) {
        base[kGpuResource].push_back(MigBacked(*g, *m));
      }
    }
    return base;
  }
  for (const gpu::Gpu* g : gpus) {
    if (!g->mig_enabled) {
      base[kGpuResource].push_back(WholeGpu(*g));
      continue;
    }
    for (const gpu::MigDevice* m : mig_devices(*g)) {
      base[MigResourceName(m->profile)].push_back(MigBacked(*g, *m));
    }
  }
  return base;
}

// Positions (into `devs`, ascending) that `sel` picks from resource `name`.
Result<std::vector<size_t>> Select(const gpu::Inventory& inv, config::MigStrategy mig,
                                   const std::string& name,
                                   const std::vector<AdvertisedDevice>& devs,
                                   const config::DeviceSelection& sel,
                                   const config::SourceLocation& devices_loc) {
  using K = config::DeviceSelection::Kind;
  std::vector<size_t> out;
  if (sel.kind == K::kAll) {
    for (size_t i = 0; i < devs.size(); ++i) out.push_back(i);
    return out;
  }
  if (sel.kind == K::kCount) {
    if (static_cast<size_t>(sel.count) > devs.size()) {
      return config::InvalidAt(devices_loc, "asks for " + std::to_string(sel.count) +
                                                " devices, but " + name + " has only " +
                                                std::to_string(devs.size()) + " on this node");
    }
    for (size_t i = 0; i < static_cast<size_t>(sel.count); ++i) out.push_back(i);
    return out;
  }
  std::map<size_t, std::string> chosen;  // position → the ref that chose it
  for (const config::DeviceRef& ref : sel.list) {
    std::vector<size_t> hits;
    std::string what = Quote(ref.id);
    using R = config::DeviceRef::Kind;
    if (ref.kind == R::kIndex || ref.kind == R::kGpuUuid) {
      const gpu::Gpu* g = nullptr;
      if (ref.kind == R::kGpuUuid) {
        g = inv.FindByUuid(ref.id);
      } else if (std::optional<unsigned> i = ParseIndex(ref.id)) {
        for (const gpu::Gpu& c : inv.gpus) {
          if (c.index == *i) g = &c;
        }
      }
      if (!g) {
        return config::InvalidAt(ref.where, "unknown device " + what + ": this node has " +
                                                std::to_string(inv.gpus.size()) + " GPUs");
      }
      for (size_t i = 0; i < devs.size(); ++i) {
        if (devs[i].gpu_index == g->index) hits.push_back(i);
      }
      if (hits.empty()) {
        return config::InvalidAt(
            ref.where, "GPU " + std::to_string(g->index) + " has no devices in " + name +
                           (g->mig_enabled && mig != config::MigStrategy::kNone
                                ? " (MIG is enabled on it: select its MIG devices under their "
                                  "nvidia.com/mig-… resource)"
                                : ""));
      }
    } else {
      if (mig == config::MigStrategy::kNone) {
        return config::InvalidAt(ref.where, "MIG device " + what +
                                                " needs flags.migStrategy single or mixed "
                                                "(it is none: GPUs are shared whole)");
      }
      const gpu::MigDevice* m = nullptr;
      if (ref.kind == R::kMigUuid) {
        m = inv.FindMigByUuid(ref.id);
      } else {
        const size_t colon = ref.id.find(':');
        std::optional<unsigned> gi = ParseIndex(std::string_view(ref.id).substr(0, colon));
        std::optional<unsigned> mi = ParseIndex(std::string_view(ref.id).substr(colon + 1));
        for (const gpu::Gpu& g : inv.gpus) {
          for (const gpu::MigDevice& c : g.mig_devices) {
            if (gi && mi && g.index == *gi && c.mig_index == *mi) m = &c;
          }
        }
      }
      if (!m) return config::InvalidAt(ref.where, "unknown MIG device " + what);
      for (size_t i = 0; i < devs.size(); ++i) {
        if (devs[i].uuid == m->uuid) hits.push_back(i);
      }
      if (hits.empty()) {
        return config::InvalidAt(ref.where, "MIG device " + what + " (profile " + m->profile +
                                                ") is not a device of " + name);
      }
    }
    for (size_t h : hits) {
      auto [it, fresh] = chosen.emplace(h, ref.where.field);
      if (!fresh) {
        return config::InvalidAt(ref.where, "device " + what + " selects " + devs[h].id +
                                                " again (already selected by " + it->second + ")");
      }
    }
  }
  for (const auto& [pos, field] : chosen) out.push_back(pos);
  return out;
}

bool DeviceOrder(const AdvertisedDevice& a, const AdvertisedDevice& b) {
  if (a.gpu_index != b.gpu_index) return a.gpu_index < b.gpu_index;
  if (a.mig_index != b.mig_index) return a.mig_index < b.mig_index;
  return a.replica < b.replica;
}

// A shared resource being assembled from one or more sharing entries.
struct Target {
  std::string base_name;
  const config::ReplicatedResource* first = nullptr;
  std::vector<AdvertisedDevice> devices;
  int max_replicas = 1;
};

// sharing.memory: the pool's resource, and `pooled` (GPU UUID → the entry that pooled it).
// nullopt (with a note) when the node has no GPU for it.
Result<std::optional<Resource>> PlanMemoryPool(const gpu::Inventory& inventory,
                                               config::MigStrategy mig, const BaseResources& base,
                                               const config::MemoryPool& pool,
                                               std::map<std::string, std::string>& pooled,
                                               std::vector<std::string>& notes) {
  Resource r;
  r.name = pool.advertised_name;
  r.socket_name = SocketNameFor(r.name);
  r.sharing = SharingKind::kMemory;
  r.unit_bytes = pool.unit_bytes;
  for (const config::MemoryPoolResource& e : pool.resources) {
    const config::SourceLocation devices_loc =
        e.devices.where.line > 0 ? e.devices.where : Sub(e.where, ".devices");
    auto b = base.find(e.name);
    if (b == base.end()) {
      if (e.devices.kind == config::DeviceSelection::Kind::kAll) {
        notes.push_back(e.where.ToString() + ": " + e.name +
                        " has no devices on this node; entry skipped");
        continue;
      }
      return config::InvalidAt(devices_loc, e.name + " has no devices on this node");
    }
    Result<std::vector<size_t>> picked =
        Select(inventory, mig, e.name, b->second, e.devices, devices_loc);
    if (!picked.ok()) return picked.status();
    for (size_t p : *picked) {
      const AdvertisedDevice& d = b->second[p];
      if (d.mig_index) {
        return config::InvalidAt(devices_loc, "the memory pool takes whole GPUs, and " + d.id +
                                                  " is a MIG device (GPU " +
                                                  std::to_string(d.gpu_index) +
                                                  " is in MIG mode under migStrategy " +
                                                  config::MigStrategyName(mig) + ")");
      }
      if (auto [it, fresh] = pooled.emplace(d.uuid, e.where.field); !fresh) {
        return config::InvalidAt(devices_loc, "GPU " + std::to_string(d.gpu_index) + " (" + d.uuid +
                                                  ") is already in the memory pool (" + it->second +
                                                  ")");
      }
      const gpu::Gpu* g = inventory.FindByUuid(d.uuid);
      const uint64_t memory = g ? g->memory_mib * (uint64_t{1} << 20) : 0;
      const uint64_t units = memory / pool.unit_bytes;
      if (units == 0) {
        return config::InvalidAt(
            pool.unit_where, "unit " + config::UnitQuantity(pool.unit_bytes) +
                                 " is larger than GPU " + std::to_string(d.gpu_index) +
                                 "'s memory (" + std::to_string(g ? g->memory_mib : 0) + " MiB)");
      }
      if (units > kMaxUnitsPerGpu) {
        return config::InvalidAt(
            pool.unit_where, "unit " + config::UnitQuantity(pool.unit_bytes) + " splits GPU " +
                                 std::to_string(d.gpu_index) + " into " + std::to_string(units) +
                                 " devices, more than " + std::to_string(kMaxUnitsPerGpu) +
                                 " (choose a larger unit)");
      }
      for (uint64_t k = 0; k < units; ++k) {
        AdvertisedDevice u = d;
        u.id = MemoryUnitId(d.uuid, static_cast<int>(k));
        u.replica = static_cast<int>(k);
        u.replicas = static_cast<int>(units);
        r.devices.push_back(std::move(u));
      }
      r.replicas = std::max(r.replicas, static_cast<int>(units));
    }
  }
  if (r.devices.empty()) return std::optional<Resource>();
  std::sort(r.devices.begin(), r.devices.end(), DeviceOrder);
  return std::optional<Resource>(std::move(r));
}

}  // namespace

Result<Plan> BuildPlan(const gpu::Inventory& inventory, const config::Config& config) {
  const config::MigStrategy mig = config.flags.mig_strategy.value_or(config::MigStrategy::kNone);
  std::vector<const gpu::Gpu*> ordered;
  for (const gpu::Gpu& g : inventory.gpus) ordered.push_back(&g);
  std::sort(ordered.begin(), ordered.end(),
            [](const gpu::Gpu* a, const gpu::Gpu* b) { return a->index < b->index; });
  Result<BaseResources> base_or = BaseFromMig(ordered, config, mig);
  if (!base_or.ok()) return base_or.status();
  BaseResources base = std::move(base_or).value();

  Plan plan;
  const config::ReplicaSharing* section = nullptr;
  SharingKind kind = SharingKind::kNone;
  if (config.sharing.time_slicing) {
    section = &*config.sharing.time_slicing;
    kind = SharingKind::kTimeSlicing;
  } else if (config.sharing.mps) {
    section = &*config.sharing.mps;
    kind = SharingKind::kMps;
  }

  std::map<std::string, std::string> pooled;  // GPU UUID → memory entry field that pools it
  std::optional<Resource> memory;
  if (config.sharing.memory) {
    Result<std::optional<Resource>> m =
        PlanMemoryPool(inventory, mig, base, *config.sharing.memory, pooled, plan.notes);
    if (!m.ok()) return m.status();
    memory = std::move(m).value();
  }

  std::map<std::string, Target> targets;     // advertised name → shared resource
  std::map<std::string, std::string> taken;  // backing UUID → entry field that shares it
  if (section) {
    for (const config::ReplicatedResource& e : section->resources) {
      const config::SourceLocation name_loc = Sub(e.where, ".name");
      const config::SourceLocation devices_loc =
          e.devices.where.line > 0 ? e.devices.where : Sub(e.where, ".devices");
      const bool is_mig_name = e.name.rfind("nvidia.com/mig-", 0) == 0;
      if (e.name != kGpuResource && !is_mig_name) {
        return config::InvalidAt(name_loc, "unknown resource " + Quote(e.name) +
                                               ": gpulet shares nvidia.com/gpu and "
                                               "nvidia.com/mig-<profile> devices");
      }
      if (is_mig_name && mig != config::MigStrategy::kMixed) {
        return config::InvalidAt(name_loc, Quote(e.name) +
                                               " is a MIG resource, advertised only with "
                                               "flags.migStrategy mixed (it is " +
                                               config::MigStrategyName(mig) + ")");
      }
      auto b = base.find(e.name);
      if (b == base.end()) {
        if (e.devices.kind == config::DeviceSelection::Kind::kAll) {
          plan.notes.push_back(e.where.ToString() + ": " + e.name +
                               " has no devices on this node; entry skipped");
          continue;
        }
        return config::InvalidAt(devices_loc, e.name + " has no devices on this node");
      }
      Result<std::vector<size_t>> picked =
          Select(inventory, mig, e.name, b->second, e.devices, devices_loc);
      if (!picked.ok()) return picked.status();

      if (kind == SharingKind::kMps) {
        for (size_t p : *picked) {
          const AdvertisedDevice& d = b->second[p];
          if (d.mig_index) {
            return config::InvalidAt(name_loc, "MPS on MIG devices is not supported (" + d.id +
                                                   " is a MIG device; share it with "
                                                   "timeSlicing, or disable MIG on GPU " +
                                                   std::to_string(d.gpu_index) + ")");
          }
          const gpu::Gpu* g = inventory.FindByUuid(d.uuid);
          const int limit = g ? MpsClientLimit(g->cc_major, g->cc_minor) : 48;
          if (e.replicas > limit) {
            return config::InvalidAt(
                Sub(e.where, ".replicas"),
                "MPS serves at most " + std::to_string(limit) + " clients per GPU" +
                    (limit < 48
                         ? " before compute capability 7.5 (GPU " + std::to_string(d.gpu_index) +
                               " is " + (g ? g->compute_capability() : "?") + ")"
                         : "") +
                    ", got " + std::to_string(e.replicas));
          }
        }
      }

      Target& t = targets[e.advertised_name];
      if (!t.first) {
        t.first = &e;
        t.base_name = e.name;
      } else if (kind == SharingKind::kMps && t.first->replicas != e.replicas) {
        return config::InvalidAt(Sub(e.where, ".replicas"),
                                 "MPS entries of " + e.advertised_name +
                                     " must give the same replicas (" + t.first->where.field +
                                     " has " + std::to_string(t.first->replicas) + ", got " +
                                     std::to_string(e.replicas) + ")");
      }
      t.max_replicas = std::max(t.max_replicas, e.replicas);
      for (size_t p : *picked) {
        const AdvertisedDevice& d = b->second[p];
        if (auto pool = pooled.find(d.uuid); pool != pooled.end()) {
          return config::InvalidAt(devices_loc, "GPU " + std::to_string(d.gpu_index) + " (" +
                                                    d.uuid + ") is in the memory pool (" +
                                                    pool->second +
                                                    "); a GPU is in exactly one pool");
        }
        auto [it, fresh] = taken.emplace(d.uuid, e.where.field);
        if (!fresh) {
          return config::InvalidAt(devices_loc, "device " + d.id + " (GPU " +
                                                    std::to_string(d.gpu_index) +
                                                    ") is already shared by " + it->second);
        }
        for (int n = 0; n < e.replicas; ++n) {
          AdvertisedDevice r = d;
          r.id = d.id + "::" + std::to_string(n);
          r.replica = n;
          r.replicas = e.replicas;
          t.devices.push_back(std::move(r));
        }
      }
    }
  }

  // Names another resource's devices would be advertised under.
  for (const auto& [name, t] : targets) {
    if (name != t.base_name && base.count(name)) {
      const config::SourceLocation loc =
          t.first->rename.empty() ? Sub(t.first->where, ".name") : t.first->rename_where;
      return config::InvalidAt(
          loc, "advertised name " + Quote(name) + " clashes with a resource this node advertises");
    }
  }

  if (memory && (base.count(memory->name) || targets.count(memory->name))) {
    const config::MemoryPool& pool = *config.sharing.memory;
    return config::InvalidAt(
        pool.rename_where.line > 0 ? pool.rename_where : Sub(pool.where, ".rename"),
        "advertised name " + Quote(memory->name) + " clashes with a resource this node advertises");
  }

  for (auto& [name, devs] : base) {
    std::vector<AdvertisedDevice> rest;
    size_t pooled_here = 0;
    for (AdvertisedDevice& d : devs) {
      if (pooled.count(d.uuid)) {
        ++pooled_here;
      } else if (!taken.count(d.uuid)) {
        rest.push_back(std::move(d));
      }
    }
    auto t = targets.find(name);
    if (t != targets.end() && !rest.empty()) {
      const config::ReplicatedResource& e = *t->second.first;
      return config::InvalidAt(
          e.devices.where.line > 0 ? e.devices.where : Sub(e.where, ".devices"),
          "shares " + std::to_string(devs.size() - pooled_here - rest.size()) + " of the " +
              std::to_string(devs.size() - pooled_here) + " devices of " + name +
              " without renaming them; the others would be advertised unshared under the same "
              "name (select all devices, or set rename / renameByDefault)");
    }
    if (rest.empty() || t != targets.end()) continue;
    Resource r;
    r.name = name;
    r.socket_name = SocketNameFor(name);
    r.devices = std::move(rest);
    plan.resources.push_back(std::move(r));
  }
  for (auto& [name, t] : targets) {
    if (t.devices.empty()) continue;
    Resource r;
    r.name = name;
    r.socket_name = SocketNameFor(name);
    r.sharing = kind;
    r.replicas = t.max_replicas;
    r.fail_requests_greater_than_one =
        section->fail_requests_greater_than_one.value_or(kind == SharingKind::kMps);
    std::sort(t.devices.begin(), t.devices.end(), DeviceOrder);
    r.devices = std::move(t.devices);
    plan.resources.push_back(std::move(r));
  }
  if (memory) plan.resources.push_back(std::move(*memory));
  std::sort(plan.resources.begin(), plan.resources.end(),
            [](const Resource& a, const Resource& b) { return a.name < b.name; });
  return plan;
}

bool SameDevices(const gpu::Inventory& a, const gpu::Inventory& b) {
  if (a.gpus.size() != b.gpus.size()) return false;
  for (size_t i = 0; i < a.gpus.size(); ++i) {
    const gpu::Gpu& x = a.gpus[i];
    const gpu::Gpu& y = b.gpus[i];
    if (x.index != y.index || x.uuid != y.uuid || x.minor != y.minor ||
        x.mig_enabled != y.mig_enabled || x.mig_devices.size() != y.mig_devices.size()) {
      return false;
    }
    for (size_t j = 0; j < x.mig_devices.size(); ++j) {
      const gpu::MigDevice& m = x.mig_devices[j];
      const gpu::MigDevice& n = y.mig_devices[j];
      if (m.uuid != n.uuid || m.mig_index != n.mig_index || m.profile != n.profile ||
          m.gi_cap_path != n.gi_cap_path || m.ci_cap_path != n.ci_cap_path) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace gpulet::sharing
