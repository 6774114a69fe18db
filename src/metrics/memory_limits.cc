#include "metrics/memory_limits.h"

#include <optional>
#include <set>

#include "common/tenant_file.h"
#include "common/utf8.h"
#include "cudashim/region.h"
#include "deviceplugin/memory_limits_janitor.h"

namespace gpulet::metrics {

namespace {

// The limits of one directory (the agent's file, still read through TenantDir), or nullopt. A
// version 2 file (the node names the driver library) is the same limits with the path after them.
std::optional<cudashim::LimitsFile> ReadLimits(const TenantDir& dir) {
  cudashim::LimitsFile f{};
  if (!dir.ReadPrefix(cudashim::kLimitsFileName, &f, sizeof f, sizeof f).ok() &&
      !dir.ReadPrefix(cudashim::kLimitsFileName, &f, sizeof f, cudashim::kLimitsFileV2Bytes).ok()) {
    return std::nullopt;
  }
  if (!cudashim::CheckLimits(f, dir.path()).empty()) return std::nullopt;
  return f;
}

// The usage counters of cuda/memory.region: a validated copy, or empty.
std::vector<cudashim::GpuUsage> ReadUsage(const TenantDir& dir) {
  std::vector<cudashim::GpuUsage> out;
  Result<TenantDir> tenant = dir.OpenDir(deviceplugin::kTenantDirName);
  if (!tenant.ok()) return out;
  std::vector<unsigned char> copy(cudashim::kRegionPrefixBytes);
  if (!tenant
           ->ReadPrefix(cudashim::kRegionFileName, copy.data(), copy.size(),
                        sizeof(cudashim::RegionLayout))
           .ok()) {
    return out;
  }
  if (!cudashim::ParseRegionCopy(copy.data(), copy.size(), sizeof(cudashim::RegionLayout), &out)
           .empty()) {
    out.clear();
  }
  return out;
}

}  // namespace

std::vector<ContainerMemory> ReadContainerMemory(
    const std::string& state_dir, const std::map<std::string, ContainerOwner>& owners) {
  std::vector<ContainerMemory> out;
  Result<TenantDir> root = TenantDir::Open(state_dir);
  if (!root.ok()) return out;
  const std::vector<deviceplugin::ContainerDir> dirs = deviceplugin::ReadContainerDirs(*root);
  const std::set<std::string> superseded = deviceplugin::SupersededDirs(dirs);
  for (const deviceplugin::ContainerDir& d : dirs) {
    if (superseded.count(d.name) != 0) continue;  // ended: a newer Allocate holds its IDs
    Result<TenantDir> dir = root->OpenDir(d.name);
    if (!dir.ok()) continue;
    const std::optional<cudashim::LimitsFile> limits = ReadLimits(*dir);
    if (!limits) continue;  // not a region of this release
    const std::vector<cudashim::GpuUsage> usage = ReadUsage(*dir);
    ContainerOwner owner;
    for (const std::string& id : d.device_ids) {
      if (auto it = owners.find(id); it != owners.end()) {
        owner = it->second;
        break;
      }
    }
    for (uint32_t i = 0; i < limits->gpu_count; ++i) {
      ContainerMemory m{owner, limits->gpus[i].uuid, i < usage.size() ? usage[i].used : 0,
                        limits->gpus[i].limit};
      out.push_back(std::move(m));
    }
  }
  return out;
}

namespace {

// Appends `name="value"` (escaped) to a label list. Label values must be UTF-8 (Prometheus
// refuses the whole scrape otherwise): false, and nothing appended, for one that is not.
bool AppendLabel(std::string* out, const char* name, const std::string& value) {
  if (!IsValidUtf8(value)) return false;
  if (!out->empty()) *out += ',';
  *out += name;
  *out += "=\"";
  for (char c : value) {
    if (c == '\\' || c == '"') *out += '\\';
    if (c == '\n') {
      *out += "\\n";
      continue;
    }
    *out += c;
  }
  *out += '"';
  return true;
}

}  // namespace

std::string RenderContainerMemory(const std::vector<ContainerMemory>& samples) {
  if (samples.empty()) return "";
  std::string out;
  auto family = [&](const char* name, const char* help, auto value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n";
    for (const ContainerMemory& s : samples) {
      std::string labels;
      if (!AppendLabel(&labels, "namespace", s.owner.namespace_) ||
          !AppendLabel(&labels, "pod", s.owner.pod) ||
          !AppendLabel(&labels, "container", s.owner.container) ||
          !AppendLabel(&labels, "UUID", s.uuid)) {
        continue;  // dropped: one series less, the scrape stays valid
      }
      out += std::string(name) + "{" + labels + "} " + std::to_string(value(s)) + "\n";
    }
  };
  family("gpulet_container_memory_used_bytes",
         "GPU memory a container holds under its enforced limit (libgpulet-cuda.so accounting).",
         [](const ContainerMemory& s) { return s.used; });
  family("gpulet_container_memory_limit_bytes",
         "The container's enforced GPU memory limit on this GPU.",
         [](const ContainerMemory& s) { return s.limit; });
  return out;
}

std::string ContainerMemoryText(const std::string& state_dir,
                                const std::string& pod_resources_socket) {
  std::map<std::string, ContainerOwner> owners;
  auto listed = deviceplugin::ListPodDevices(pod_resources_socket, std::chrono::seconds(5));
  if (listed.ok()) {
    for (const auto& [id, c] : listed->devices)
      owners[id] = ContainerOwner{c.namespace_, c.pod, c.container};
  }
  return RenderContainerMemory(ReadContainerMemory(state_dir, owners));
}

}  // namespace gpulet::metrics
