#include "metrics/memory_limits.h"

#include <filesystem>
#include <fstream>

#include "cudashim/region.h"
#include "deviceplugin/memory_limits_janitor.h"

namespace gpulet::metrics {

namespace fs = std::filesystem;

std::vector<ContainerMemory> ReadContainerMemory(
    const std::string& state_dir, const std::map<std::string, ContainerOwner>& owners) {
  std::vector<ContainerMemory> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(state_dir, ec)) {
    std::ifstream devices(e.path() / "devices");
    if (!devices) continue;
    ContainerOwner owner;
    for (std::string id; std::getline(devices, id);) {
      if (auto it = owners.find(id); it != owners.end()) {
        owner = it->second;
        break;
      }
    }
    cudashim::Region region;
    if (!region.Open(e.path().string(), /*read_only=*/true).empty()) continue;
    for (const cudashim::GpuUsage& g : region.Usage()) {
      out.push_back(ContainerMemory{owner, g.uuid, g.used, g.limit});
    }
  }
  return out;
}

namespace {

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string RenderContainerMemory(const std::vector<ContainerMemory>& samples) {
  if (samples.empty()) return "";
  std::string out;
  auto family = [&](const char* name, const char* help, auto value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n";
    for (const ContainerMemory& s : samples) {
      out += std::string(name) + "{namespace=\"" + Escape(s.owner.namespace_) + "\",pod=\"" +
             Escape(s.owner.pod) + "\",container=\"" + Escape(s.owner.container) + "\",UUID=\"" +
             Escape(s.uuid) + "\"} " + std::to_string(value(s)) + "\n";
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
    for (const auto& [id, c] : *listed)
      owners[id] = ContainerOwner{c.namespace_, c.pod, c.container};
  }
  return RenderContainerMemory(ReadContainerMemory(state_dir, owners));
}

}  // namespace gpulet::metrics
