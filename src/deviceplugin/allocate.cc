#include "deviceplugin/allocate.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

namespace gpulet::deviceplugin {
namespace {

std::string Join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const std::string& p : parts) {
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

std::string HostPath(const std::string& root, const std::string& path) {
  if (root.empty() || root == "/") return path;
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  return r + path;
}

bool Has(const AllocateOptions& o, config::DeviceListStrategy s) {
  return std::find(o.device_list_strategies.begin(), o.device_list_strategies.end(), s) !=
         o.device_list_strategies.end();
}

const gpu::Gpu* GpuByIndex(const gpu::Inventory& inv, unsigned index) {
  for (const gpu::Gpu& g : inv.gpus) {
    if (g.index == index) return &g;
  }
  return nullptr;
}

std::string BaseDeviceIdOf(const std::string& id) { return sharing::BaseDeviceId(id); }

}  // namespace

Result<v1beta1::ContainerAllocateResponse> BuildContainerAllocateResponse(
    const sharing::Resource& resource, const gpu::Inventory& inventory,
    const AllocateOptions& options, const std::vector<std::string>& device_ids,
    const std::string& unique) {
  if (device_ids.empty()) {
    return Status(ErrorCode::kInvalidInput,
                  "allocate request for " + resource.name + " names no devices");
  }
  std::vector<const sharing::AdvertisedDevice*> devices;
  std::set<std::string> seen;
  for (const std::string& id : device_ids) {
    const sharing::AdvertisedDevice* d = resource.Find(id);
    if (!d) {
      return Status(ErrorCode::kInvalidInput,
                    "unknown device ID \"" + id + "\" for resource " + resource.name);
    }
    if (!seen.insert(id).second) {
      return Status(ErrorCode::kInvalidInput,
                    "device ID \"" + id + "\" requested twice for resource " + resource.name);
    }
    devices.push_back(d);
  }
  if (resource.fail_requests_greater_than_one && resource.replicas > 1 && devices.size() > 1) {
    return Status(ErrorCode::kInvalidInput,
                  "resource " + resource.name + " is shared (" + std::to_string(resource.replicas) +
                      " replicas per device, failRequestsGreaterThanOne) and accepts requests "
                      "for 1 replica only, got a request for " +
                      std::to_string(devices.size()));
  }
  if (resource.sharing == sharing::SharingKind::kMemory) {
    std::map<unsigned, std::vector<std::string>> by_gpu;
    for (const sharing::AdvertisedDevice* d : devices) by_gpu[d->gpu_index].push_back(d->id);
    if (by_gpu.size() > 1) {
      std::string parts;
      for (const auto& [index, ids] : by_gpu) {
        std::vector<std::string> shown(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 3));
        if (ids.size() > 3) shown.push_back("…");
        if (!parts.empty()) parts += "; ";
        parts += std::to_string(ids.size()) + " on GPU " + std::to_string(index) + " (" +
                 BaseDeviceIdOf(ids[0]) + ": " + Join(shown, ", ") + ")";
      }
      return Status(ErrorCode::kInvalidInput,
                    resource.name + ": a container's memory units must all be on one GPU, got " +
                        parts +
                        " (the kubelet did not follow GetPreferredAllocation; see "
                        "docs/sharing.md, Memory pool)");
    }
  }
  const MpsMount* mps = nullptr;
  if (resource.sharing == sharing::SharingKind::kMps) {
    auto it = options.mps.find(resource.name);
    if (it == options.mps.end()) {
      return Status(ErrorCode::kUnavailable, "no MPS daemon serves " + resource.name);
    }
    mps = &it->second;
  }

  // What the container is told, de-duplicated (replicas of one GPU name it once), request order.
  std::vector<std::string> visible;
  std::set<std::string> visible_seen;
  for (const sharing::AdvertisedDevice* d : devices) {
    const std::string& v =
        options.device_id_strategy == config::DeviceIdStrategy::kIndex ? d->index : d->uuid;
    if (visible_seen.insert(v).second) visible.push_back(v);
  }

  v1beta1::ContainerAllocateResponse r;
  if (Has(options, config::DeviceListStrategy::kEnvvar)) {
    (*r.mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = Join(visible, ",");
  }
  if (Has(options, config::DeviceListStrategy::kVolumeMounts)) {
    // The toolkit reads the device list from the mount points' names.
    (*r.mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = kVolumeMountsRoot;
    for (const std::string& v : visible) {
      v1beta1::Mount* m = r.add_mounts();
      m->set_container_path(std::string(kVolumeMountsRoot) + "/" + v);
      m->set_host_path(kVolumeMountsHostPath);
      m->set_read_only(true);
    }
  }
  std::vector<std::string> cdi_names;
  for (const std::string& v : visible) cdi_names.push_back(options.cdi_kind + "=" + v);
  if (Has(options, config::DeviceListStrategy::kCdiAnnotations)) {
    (*r.mutable_annotations())[options.cdi_annotation_prefix + "gpulet_" + unique] =
        Join(cdi_names, ",");
  }
  if (Has(options, config::DeviceListStrategy::kCdiCri)) {
    for (const std::string& n : cdi_names) r.add_cdi_devices()->set_name(n);
  }

  if (resource.sharing == sharing::SharingKind::kMemory) {
    (*r.mutable_envs())[kMemoryLimitEnv] =
        std::to_string(resource.unit_bytes * static_cast<uint64_t>(devices.size()));
    (*r.mutable_envs())[kMemoryUnitsEnv] = std::to_string(devices.size());
  }

  if (mps) {
    namespace fs = std::filesystem;
    const std::string container_pipe = std::string(kMpsContainerRoot) + "/" +
                                       fs::path(mps->pipe_dir).parent_path().filename().string() +
                                       "/pipe";
    v1beta1::Mount* pipe = r.add_mounts();
    pipe->set_container_path(container_pipe);
    pipe->set_host_path(mps->pipe_dir);
    pipe->set_read_only(false);
    v1beta1::Mount* shm = r.add_mounts();
    shm->set_container_path("/dev/shm");
    shm->set_host_path(mps->shm_dir);
    shm->set_read_only(false);
    (*r.mutable_envs())["CUDA_MPS_PIPE_DIRECTORY"] = container_pipe;
    // Replicas held per physical GPU (ordered by index = the container's CUDA ordinals).
    std::map<unsigned, std::pair<int, int>> held;  // gpu index → {held, replicas of that GPU}
    for (const sharing::AdvertisedDevice* d : devices) {
      auto& [n, of] = held[d->gpu_index];
      ++n;
      of = std::max(1, d->replicas);
    }
    int percentage = 1;
    std::string limits;
    int ordinal = 0;
    for (const auto& [index, h] : held) {
      const int share = std::min(100, 100 * h.first / h.second);
      percentage = std::max(percentage, share);
      const gpu::Gpu* g = GpuByIndex(inventory, index);
      const uint64_t mib = g ? g->memory_mib * static_cast<uint64_t>(std::min(h.first, h.second)) /
                                   static_cast<uint64_t>(h.second)
                             : 0;
      if (!limits.empty()) limits += ",";
      limits += std::to_string(ordinal++) + "=" + std::to_string(mib) + "M";
    }
    (*r.mutable_envs())["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = std::to_string(percentage);
    (*r.mutable_envs())["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = limits;
  }

  if (options.pass_device_specs) {
    std::vector<std::string> paths = {"/dev/nvidiactl", "/dev/nvidia-uvm"};
    // As NVIDIA's plugin: these two are listed only when the node has them (under the dev root
    // as gpulet sees it); a runtime refuses a container whose device node does not exist.
    for (const char* optional : {"/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}) {
      if (::access(HostPath(options.nvidia_dev_root, optional).c_str(), F_OK) == 0) {
        paths.push_back(optional);
      }
    }
    for (const sharing::AdvertisedDevice* d : devices) {
      const gpu::Gpu* g = GpuByIndex(inventory, d->gpu_index);
      if (!g) continue;
      paths.push_back(g->device_path());
      if (d->mig_index) {
        for (const gpu::MigDevice& m : g->mig_devices) {
          if (m.mig_index != *d->mig_index) continue;
          if (!m.gi_cap_path.empty()) paths.push_back(m.gi_cap_path);
          if (!m.ci_cap_path.empty()) paths.push_back(m.ci_cap_path);
        }
      }
    }
    std::set<std::string> path_seen;
    for (const std::string& p : paths) {
      if (!path_seen.insert(p).second) continue;
      v1beta1::DeviceSpec* spec = r.add_devices();
      spec->set_container_path(p);
      spec->set_host_path(HostPath(options.nvidia_dev_root, p));
      spec->set_permissions("rw");
    }
  }
  return r;
}

}  // namespace gpulet::deviceplugin
