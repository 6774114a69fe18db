// Test objects in the shapes the extender reads: the per-node memory ConfigMap (the contract the
// node agent writes), pods asking for memory units, and ExtenderArgs as kube-scheduler sends them.
// Header-only; for tests and benchmarks.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace gpulet::extender::testobjects {

inline constexpr const char* kResource = "gpulet.io/gpu-memory-1gi";

struct Gpu {
  int64_t total = 80;
  int64_t free = 80;
  bool healthy = true;
};

inline std::string GpuUuid(const std::string& node, size_t i) {
  return "GPU-" + node + "-" + std::to_string(i);
}

// data["memory.json"] for `node`.
inline nlohmann::json MemoryJson(const std::string& node, const std::vector<Gpu>& gpus,
                                 int64_t generation = 1,
                                 nlohmann::json pods = nlohmann::json::array(),
                                 int heartbeat_seconds = 30) {
  nlohmann::json g = nlohmann::json::array();
  for (size_t i = 0; i < gpus.size(); ++i) {
    g.push_back({{"uuid", GpuUuid(node, i)},
                 {"index", i},
                 {"model", "NVIDIA H100 80GB HBM3"},
                 {"numaNode", i < gpus.size() / 2 ? 0 : 1},
                 {"healthy", gpus[i].healthy},
                 {"totalUnits", gpus[i].total},
                 {"freeUnits", gpus[i].free}});
  }
  return {{"version", 1},
          {"node", node},
          {"generation", generation},
          {"resource", kResource},
          {"unitBytes", 1073741824},
          {"heartbeatSeconds", heartbeat_seconds},
          {"gpus", g},
          {"pods", std::move(pods)}};
}

// The ConfigMap around a memory.json text (resourceVersion as the API server would set it).
inline nlohmann::json MemoryConfigMap(const std::string& node, const std::string& memory_json,
                                      const std::string& resource_version = "1",
                                      const std::string& ns = "gpulet-system") {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata",
           {{"name", "gpulet-memory-" + node},
            {"namespace", ns},
            {"resourceVersion", resource_version},
            {"labels",
             {{"app.kubernetes.io/name", "gpulet"},
              {"gpulet.io/memory-pool", "true"},
              {"gpulet.io/node", node}}}}},
          {"data", {{"memory.json", memory_json}}}};
}

// A pod whose containers ask for `units` each (0 = no request), as the API server shows it.
inline nlohmann::json MemoryPod(const std::string& name, const std::vector<int64_t>& units,
                                const std::string& ns = "default",
                                const std::string& resource = kResource) {
  nlohmann::json containers = nlohmann::json::array();
  for (size_t i = 0; i < units.size(); ++i) {
    nlohmann::json c = {{"name", "c" + std::to_string(i)}, {"image", "registry.k8s.io/pause:3.9"}};
    if (units[i] > 0) {
      c["resources"] = {{"limits", {{resource, std::to_string(units[i])}}},
                        {"requests", {{resource, std::to_string(units[i])}}}};
    }
    containers.push_back(c);
  }
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"uid", "uid-" + ns + "-" + name}}},
          {"spec", {{"schedulerName", "gpulet-memory"}, {"containers", containers}}},
          {"status", {{"phase", "Pending"}}}};
}

// ExtenderArgs in node-cache mode, the way kube-scheduler marshals it (Nodes null).
inline std::string CacheModeArgs(const nlohmann::json& pod, const std::vector<std::string>& nodes) {
  return nlohmann::json{{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", nodes}}.dump();
}

inline std::string BindingArgs(const nlohmann::json& pod, const std::string& node) {
  return nlohmann::json{{"PodName", pod["metadata"]["name"]},
                        {"PodNamespace", pod["metadata"]["namespace"]},
                        {"PodUID", pod["metadata"]["uid"]},
                        {"Node", node}}
      .dump();
}

}  // namespace gpulet::extender::testobjects
