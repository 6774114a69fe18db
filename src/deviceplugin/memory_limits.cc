#include "deviceplugin/memory_limits.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <sstream>

#include "common/files.h"

namespace gpulet::deviceplugin {

Result<std::map<std::string, MemoryLimitSettings>> ResolveMemoryLimits(
    const config::MemoryLimits& limits, const config::Config& config, const sharing::Plan& plan) {
  std::map<std::string, MemoryLimitSettings> out;
  for (const config::MemoryLimitResource& entry : limits.resources) {
    // The entry's own name may also be the base resource that keeps the GPUs no time-slicing
    // entry selects: only the time-sliced resources it names get limits.
    const sharing::Resource* unshared = nullptr;
    bool found = false;
    for (const sharing::Resource& r : plan.resources) {
      if (limits.Find(config, r.name) != &entry) continue;
      if (r.sharing == sharing::SharingKind::kMemory) {
        // A memory-pool container's limit is its units × the unit: nothing to choose.
        if (entry.per_replica) {
          return config::InvalidAt(entry.where, r.name +
                                                    " is a memory-pool resource: its limit is "
                                                    "units × unit, remove perReplica");
        }
        found = true;
        out[r.name] = MemoryLimitSettings{r.unit_bytes, limits.library, limits.state_dir};
        out[r.name].passthrough = entry.pass_through;
        continue;
      }
      if (r.sharing != sharing::SharingKind::kTimeSlicing) {
        unshared = &r;
        continue;
      }
      found = true;
      out[r.name] = MemoryLimitSettings{entry.per_replica, limits.library, limits.state_dir};
      out[r.name].passthrough = entry.pass_through;
    }
    if (!found && unshared != nullptr) {
      return config::InvalidAt(entry.where, unshared->name + " is not a time-sliced resource (" +
                                                sharing::SharingKindName(unshared->sharing) + ")");
    }
    if (!found) {
      return config::InvalidAt(
          entry.where, entry.name + ": no such time-sliced or memory-pool resource on this node");
    }
  }
  return out;
}

Result<std::map<std::string, MemoryLimitSettings>> LoadMemoryLimitSettings(
    const config::Config& config, const sharing::Plan& plan) {
  if (config.source.empty()) return std::map<std::string, MemoryLimitSettings>{};
  auto limits = config::LoadMemoryLimits(config.source);
  if (!limits.ok()) return limits.status();
  if (!limits->has_value()) return std::map<std::string, MemoryLimitSettings>{};
  return ResolveMemoryLimits(**limits, config, plan);
}

Result<std::vector<cudashim::GpuLimit>> ContainerMemoryLimits(const sharing::Resource& resource,
                                                              const gpu::Inventory& inventory,
                                                              const MemoryLimitSettings& settings,
                                                              const std::vector<std::string>& ids) {
  std::vector<cudashim::GpuLimit> out;
  for (const std::string& id : ids) {
    const sharing::AdvertisedDevice* d = resource.Find(id);
    if (d == nullptr) {
      return Status(ErrorCode::kInvalidInput, resource.name + " does not advertise device " + id);
    }
    const gpu::Gpu* g = inventory.FindByUuid(d->uuid);
    if (g == nullptr)
      return Status(ErrorCode::kNotFound, "GPU " + d->uuid + " not in the inventory");
    const uint64_t share = settings.per_replica.value_or(
        g->memory_mib * 1024 * 1024 / static_cast<uint64_t>(std::max(d->replicas, 1)));
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const cudashim::GpuLimit& l) { return l.uuid == d->uuid; });
    if (it == out.end()) {
      out.push_back(cudashim::GpuLimit{d->uuid, 0, 0});
      it = out.end() - 1;
    }
    it->limit += share;  // k replicas of one GPU: k shares
  }
  return out;
}

uint64_t NextAllocationNumber() {
  static std::atomic<uint64_t> last{0};
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  uint64_t want = static_cast<uint64_t>(std::max<int64_t>(now.count(), 1));
  uint64_t prev = last.load();
  while (true) {
    const uint64_t next = std::max(want, prev + 1);
    if (last.compare_exchange_weak(prev, next)) return next;
  }
}

Status AddMemoryLimits(const MemoryLimitSettings& settings,
                       const std::vector<cudashim::GpuLimit>& gpus,
                       const std::vector<std::string>& ids, const std::string& allocation,
                       v1beta1::ContainerAllocateResponse* response) {
  Result<cudashim::LimitsEdits> edits = cudashim::CreateLimitsDir(
      settings.state_dir, allocation, settings.library, gpus, settings.passthrough);
  if (!edits.ok()) return edits.status();
  const std::string dir = settings.state_dir + "/" + allocation;
  std::string devices;
  for (const std::string& id : ids) devices += id + "\n";
  if (Status s = WriteFileAtomic(dir + "/" + kDevicesFileName, devices, 0644); !s.ok()) return s;
  if (Status s = WriteFileAtomic(dir + "/" + kAllocationFileName,
                                 std::to_string(NextAllocationNumber()) + "\n", 0644);
      !s.ok()) {
    return s;
  }
  for (const cudashim::LimitsMount& m : edits->mounts) {
    v1beta1::Mount* out = response->add_mounts();
    out->set_container_path(m.container_path);
    out->set_host_path(m.host_path);
    out->set_read_only(m.read_only);
  }
  for (const auto& [key, value] : edits->env) (*response->mutable_envs())[key] = value;
  return Status::Ok();
}

Status ApplyMemoryLimits(const std::map<std::string, MemoryLimitSettings>& settings,
                         const sharing::Resource& resource, const gpu::Inventory& inventory,
                         const std::vector<std::string>& ids, const std::string& allocation,
                         v1beta1::ContainerAllocateResponse* response) {
  auto it = settings.find(resource.name);
  if (it == settings.end()) return Status::Ok();
  auto gpus = ContainerMemoryLimits(resource, inventory, it->second, ids);
  if (!gpus.ok()) return gpus.status();
  return AddMemoryLimits(it->second, *gpus, ids, allocation, response);
}

std::vector<ContainerDir> ReadContainerDirs(const TenantDir& state_dir) {
  constexpr size_t kMaxDevicesBytes = 64 * 1024;  // thousands of IDs
  constexpr size_t kMaxAllocationBytes = 64;
  std::vector<ContainerDir> out;
  Result<std::vector<TenantDir::Entry>> entries = state_dir.List();
  if (!entries.ok()) return out;
  for (const TenantDir::Entry& e : *entries) {
    if (!e.directory) continue;
    Result<TenantDir> dir = state_dir.OpenDir(e.name);
    if (!dir.ok()) continue;
    Result<std::string> devices = dir->ReadFile(kDevicesFileName, kMaxDevicesBytes);
    if (!devices.ok()) continue;  // not one of ours, or not readable as ours
    ContainerDir d;
    d.name = e.name;
    std::istringstream lines(*devices);
    for (std::string id; std::getline(lines, id);) {
      if (!id.empty()) d.device_ids.push_back(id);
    }
    if (Result<std::string> a = dir->ReadFile(kAllocationFileName, kMaxAllocationBytes); a.ok()) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(a->c_str(), &end, 10);
      if (end != a->c_str()) d.allocation = n;
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::set<std::string> SupersededDirs(const std::vector<ContainerDir>& dirs) {
  std::map<std::string, uint64_t> newest;  // device ID -> newest allocation holding it
  for (const ContainerDir& d : dirs) {
    for (const std::string& id : d.device_ids) {
      uint64_t& n = newest[id];
      n = std::max(n, d.allocation);
    }
  }
  std::set<std::string> out;
  for (const ContainerDir& d : dirs) {
    for (const std::string& id : d.device_ids) {
      if (newest[id] > d.allocation) {
        out.insert(d.name);
        break;
      }
    }
  }
  return out;
}

}  // namespace gpulet::deviceplugin
