#include "deviceplugin/memory_limits.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/files.h"

namespace gpulet::deviceplugin {

namespace fs = std::filesystem;

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
        continue;
      }
      if (r.sharing != sharing::SharingKind::kTimeSlicing) {
        unshared = &r;
        continue;
      }
      found = true;
      out[r.name] = MemoryLimitSettings{entry.per_replica, limits.library, limits.state_dir};
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

Status AddMemoryLimits(const MemoryLimitSettings& settings,
                       const std::vector<cudashim::GpuLimit>& gpus,
                       const std::vector<std::string>& ids, const std::string& allocation,
                       v1beta1::ContainerAllocateResponse* response) {
  const std::string dir = settings.state_dir + "/" + allocation;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status(ErrorCode::kInternal, dir + ": create: " + ec.message());
  // Every user of the container reaches the region through this directory.
  if (::chmod(dir.c_str(), 0755) != 0) {
    return Status(ErrorCode::kInternal, dir + ": chmod 0755: " + std::strerror(errno));
  }
  std::string devices;
  for (const std::string& id : ids) devices += id + "\n";
  if (Status s = WriteFileAtomic(dir + "/" + kDevicesFileName, devices, 0644); !s.ok()) return s;
  if (std::string err = cudashim::CreateRegion(dir, gpus, /*replace=*/true); !err.empty()) {
    return Status(ErrorCode::kInternal, err);
  }
  const std::string preload = settings.state_dir + "/ld.so.preload";
  if (Status s = WriteFileAtomic(preload, std::string(kContainerLibraryPath) + "\n", 0644);
      !s.ok()) {
    return s;
  }
  auto mount = [&](const std::string& container, const std::string& host, bool read_only) {
    v1beta1::Mount* m = response->add_mounts();
    m->set_container_path(container);
    m->set_host_path(host);
    m->set_read_only(read_only);
  };
  mount(kContainerLibraryPath, settings.library, true);
  mount(kContainerAccountingDir, dir, false);
  mount(kContainerPreloadFile, preload, true);
  (*response->mutable_envs())["GPULET_CUDA_DIR"] = kContainerAccountingDir;
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

std::vector<std::string> RemoveReleasedContainerDirs(const std::string& state_dir,
                                                     const std::set<std::string>& listed,
                                                     std::chrono::system_clock::time_point now,
                                                     std::chrono::seconds grace) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(state_dir, ec)) {
    if (!e.is_directory(ec)) continue;
    std::ifstream f(e.path() / kDevicesFileName);
    if (!f) continue;  // not one of ours
    struct stat st {};
    if (::stat((e.path() / kDevicesFileName).c_str(), &st) != 0) continue;
    const auto made = std::chrono::system_clock::from_time_t(st.st_mtime);
    if (now - made < grace) continue;
    bool held = false;
    for (std::string id; std::getline(f, id);) held = held || listed.count(id) != 0;
    if (held) continue;
    fs::remove_all(e.path(), ec);
    if (!ec) removed.push_back(e.path().string());
  }
  return removed;
}

}  // namespace gpulet::deviceplugin
