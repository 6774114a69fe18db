#include "metrics/pod_resources.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <set>
#include <tuple>

#include "deviceplugin/pod_resources_client.h"
#include "dra/names.h"

namespace gpulet::metrics {
namespace {

std::optional<unsigned> ParseIndex(std::string_view s) {
  unsigned v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

bool HasPrefix(const std::string& s, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(),
                     [&](const std::string& p) { return s.compare(0, p.size(), p) == 0; });
}

}  // namespace

std::optional<EntityKey> ResolveDeviceId(const gpu::Inventory& inventory, std::string_view id,
                                         bool allow_index) {
  if (size_t replica = id.find("::"); replica != std::string_view::npos) id = id.substr(0, replica);
  if (id.rfind("GPU-", 0) == 0) {
    if (const gpu::Gpu* g = inventory.FindByUuid(std::string(id))) return EntityKey{g->index, -1};
    return std::nullopt;
  }
  if (id.rfind("MIG-", 0) == 0) {
    if (const gpu::MigDevice* m = inventory.FindMigByUuid(std::string(id))) {
      return EntityKey{m->parent_index, static_cast<int>(m->gpu_instance_id)};
    }
    return std::nullopt;
  }
  if (!allow_index) return std::nullopt;
  const size_t colon = id.find(':');
  auto gpu_index = ParseIndex(id.substr(0, colon));
  if (!gpu_index || *gpu_index >= inventory.gpus.size()) return std::nullopt;
  if (colon == std::string_view::npos) return EntityKey{*gpu_index, -1};
  auto mig_index = ParseIndex(id.substr(colon + 1));
  if (!mig_index) return std::nullopt;
  for (const gpu::MigDevice& m : inventory.gpus[*gpu_index].mig_devices) {
    if (m.mig_index == *mig_index)
      return EntityKey{*gpu_index, static_cast<int>(m.gpu_instance_id)};
  }
  return std::nullopt;
}

std::optional<EntityKey> ResolveDraDevice(const gpu::Inventory& inventory,
                                          std::string_view device_name,
                                          const MigPlacementLookup& mig_placement) {
  const std::optional<dra::DeviceName> name = dra::ParseDeviceName(device_name);
  if (!name || name->gpu_index >= inventory.gpus.size()) return std::nullopt;
  const gpu::Gpu& g = inventory.gpus[name->gpu_index];
  if (name->kind != dra::DeviceKind::kMig) return EntityKey{g.index, -1};
  // The MIG devices of GPU N with that profile (the name carries the profile's slug).
  std::vector<const gpu::MigDevice*> same_profile;
  for (const gpu::MigDevice& m : g.mig_devices) {
    if (dra::ProfileSlug(m.profile) == name->mig_profile) same_profile.push_back(&m);
  }
  for (const gpu::MigDevice* m : same_profile) {
    if (!mig_placement) break;
    const std::optional<unsigned> start = mig_placement(g.index, m->gpu_instance_id);
    if (start && *start == name->mig_start) {
      return EntityKey{g.index, static_cast<int>(m->gpu_instance_id)};
    }
  }
  if (!mig_placement && same_profile.size() == 1) {
    return EntityKey{g.index, static_cast<int>(same_profile[0]->gpu_instance_id)};
  }
  return std::nullopt;
}

MigPlacementLookup NvmlMigPlacements(std::shared_ptr<const gpu::Nvml> nvml) {
  return [nvml](unsigned gpu_index, unsigned gpu_instance_id) -> std::optional<unsigned> {
    if (!nvml) return std::nullopt;
    const gpu::NvmlFunctions& fn = nvml->fn();
    if (fn.nvmlDeviceGetHandleByIndex_v2 == nullptr ||
        fn.nvmlDeviceGetGpuInstanceProfileInfo == nullptr ||
        fn.nvmlDeviceGetGpuInstances == nullptr || fn.nvmlGpuInstanceGetInfo == nullptr) {
      return std::nullopt;
    }
    nvmlDevice_t dev{};
    if (fn.nvmlDeviceGetHandleByIndex_v2(gpu_index, &dev) != NVML_SUCCESS) return std::nullopt;
    for (unsigned p = 0; p < NVML_GPU_INSTANCE_PROFILE_COUNT; ++p) {
      nvmlGpuInstanceProfileInfo_t profile{};
      if (fn.nvmlDeviceGetGpuInstanceProfileInfo(dev, p, &profile) != NVML_SUCCESS) continue;
      std::array<nvmlGpuInstance_t, 8> instances{};  // at most 7 GPU instances per GPU
      unsigned count = static_cast<unsigned>(instances.size());
      if (fn.nvmlDeviceGetGpuInstances(dev, profile.id, instances.data(), &count) != NVML_SUCCESS) {
        continue;
      }
      for (unsigned i = 0; i < count && i < instances.size(); ++i) {
        nvmlGpuInstanceInfo_t info{};
        if (fn.nvmlGpuInstanceGetInfo(instances[i], &info) == NVML_SUCCESS &&
            info.id == gpu_instance_id) {
          return info.placement.start;
        }
      }
    }
    return std::nullopt;
  };
}

PodMap BuildPodMap(const v1::ListPodResourcesResponse& response, const gpu::Inventory& inventory,
                   const std::vector<std::string>& index_resource_prefixes,
                   const MigPlacementLookup& mig_placement) {
  PodMap map;
  for (const auto& pod : response.pod_resources()) {
    for (const auto& container : pod.containers()) {
      for (const auto& devices : container.devices()) {
        const bool allow_index = HasPrefix(devices.resource_name(), index_resource_prefixes);
        for (const std::string& id : devices.device_ids()) {
          auto key = ResolveDeviceId(inventory, id, allow_index);
          if (!key) continue;
          const size_t replica = id.find("::");
          std::string vgpu = replica == std::string::npos ? "" : id.substr(replica + 2);
          map[*key].push_back({pod.namespace_(), pod.name(), container.name(), std::move(vgpu), ""});
        }
      }
      // Dynamic Resource Allocation: the devices of the claims the container uses.
      for (const auto& claim : container.dynamic_resources()) {
        for (const auto& device : claim.claim_resources()) {
          if (device.driver_name() != dra::kDriverName) continue;
          auto key = ResolveDraDevice(inventory, device.device_name(), mig_placement);
          if (!key) continue;
          map[*key].push_back({pod.namespace_(), pod.name(), container.name(),
                               device.has_share_id() ? device.share_id() : "", "",
                               claim.claim_name(), claim.claim_namespace(), device.driver_name(),
                               device.pool_name(), device.device_name()});
        }
      }
    }
  }
  // Stable order; one entry per container and replica.
  for (auto& [key, pods] : map) {
    auto tie = [](const PodRef& p) { return std::tie(p.namespace_, p.pod, p.container, p.vgpu); };
    std::sort(pods.begin(), pods.end(),
              [&](const PodRef& a, const PodRef& b) { return tie(a) < tie(b); });
    pods.erase(std::unique(pods.begin(), pods.end()), pods.end());
  }
  return map;
}

bool ApplyPodUids(PodMap& map, const PodUidMap& uids) {
  bool all = true;
  for (auto& [key, pods] : map) {
    for (PodRef& p : pods) {
      auto it = uids.find({p.namespace_, p.pod});
      p.uid = it != uids.end() ? it->second : "";
      all = all && !p.uid.empty();
    }
  }
  return all;
}

struct PodResourcesWatcher::Connection {
  std::unique_ptr<v1::PodResourcesLister::Stub> stub;
  dev_t dev = 0;
  ino_t ino = 0;
};

PodResourcesWatcher::PodResourcesWatcher(const gpu::Inventory& inventory,
                                         PodResourcesOptions options,
                                         std::function<void(PodMap)> on_map)
    : inventory_(inventory), options_(std::move(options)), on_map_(std::move(on_map)) {}

PodResourcesWatcher::~PodResourcesWatcher() { Stop(); }

Result<PodMap> PodResourcesWatcher::ListOnce() {
  struct stat st {};
  if (::stat(options_.socket.c_str(), &st) != 0) {
    conn_.reset();
    return Status(ErrorCode::kUnavailable,
                  "pod-resources socket " + options_.socket + " not found");
  }
  // A recreated socket (kubelet restart) is a new file: connect afresh rather than wait out the
  // old channel's reconnect backoff.
  if (conn_ && (conn_->dev != st.st_dev || conn_->ino != st.st_ino)) conn_.reset();
  if (!conn_) {
    auto c = std::make_unique<Connection>();
    c->stub = deviceplugin::PodResourcesStub(options_.socket);
    c->dev = st.st_dev;
    c->ino = st.st_ino;
    conn_ = std::move(c);
  }
  Result<v1::ListPodResourcesResponse> resp =
      deviceplugin::ListPodResources(*conn_->stub, options_.socket, options_.call_timeout);
  if (!resp.ok()) {
    conn_.reset();
    return resp.status();
  }
  PodMap map =
      BuildPodMap(*resp, inventory_, options_.index_resource_prefixes, options_.mig_placement);
  if (options_.list_pod_uids && !ApplyPodUids(map, uids_)) {
    // A pod we have no UID for yet: ask the API server again (once per refresh at most).
    Result<PodUidMap> uids = options_.list_pod_uids();
    if (uids.ok()) {
      if (uids_failing_) spdlog::info("event=pod_uids_recovered");
      uids_failing_ = false;
      uids_ = std::move(uids).value();
      ApplyPodUids(map, uids_);
    } else if (!uids_failing_) {
      uids_failing_ = true;
      spdlog::warn("event=pod_uids_unavailable error=\"{}\" effect=\"per-pod DCGM_FI_DEV_GPU_UTIL "
                   "and DCGM_FI_DEV_FB_USED left out for pods without a known UID\"",
                   uids.status().message());
    }
  }
  return map;
}

void PodResourcesWatcher::Start() {
  auto refresh = [this] {
    auto map = ListOnce();
    if (map.ok()) {
      if (failing_) spdlog::info("event=pod_resources_recovered socket={}", options_.socket);
      failing_ = false;
      on_map_(std::move(map).value());
    } else if (!failing_) {
      failing_ = true;
      spdlog::warn(
          "event=pod_resources_unavailable error=\"{}\" effect=\"keeping last pod labels\"",
          map.status().message());
    }
    {
      std::lock_guard lock(mu_);
      ++refreshes_;
    }
    refreshed_.notify_all();
  };
  refresh();
  thread_ = std::thread([this, refresh] {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, options_.refresh, [this] { return stop_; })) {
      lock.unlock();
      refresh();
      lock.lock();
    }
  });
}

uint64_t PodResourcesWatcher::refreshes() const {
  std::lock_guard lock(mu_);
  return refreshes_;
}

bool PodResourcesWatcher::WaitForRefreshes(uint64_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return refreshed_.wait_for(lock, timeout, [&] { return refreshes_ >= n; });
}

void PodResourcesWatcher::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace gpulet::metrics
