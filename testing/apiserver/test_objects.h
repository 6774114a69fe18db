// Kubernetes objects that several test suites put into the fake API server.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace gpulet::testing {

// A pod in `ns` asking for `gpus` nvidia.com/gpu: Running on `node` when `node` is non-empty,
// otherwise Pending with PodScheduled=False/Unschedulable, as the scheduler leaves a pod it
// cannot place.
inline nlohmann::json GpuPodObject(const std::string& name, const std::string& ns, int gpus,
                                   const std::string& node) {
  using nlohmann::json;
  json p = {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata", {{"name", name}, {"namespace", ns}}},
            {"spec",
             {{"containers",
               json::array({{{"name", "c"},
                             {"resources",
                              {{"limits", {{"nvidia.com/gpu", std::to_string(gpus)}}}}}}})}}}};
  if (!node.empty()) {
    p["spec"]["nodeName"] = node;
    p["status"] = {{"phase", "Running"}};
  } else {
    p["status"] = {
        {"phase", "Pending"},
        {"conditions",
         json::array(
             {{{"type", "PodScheduled"}, {"status", "False"}, {"reason", "Unschedulable"}}})}};
  }
  return p;
}

}  // namespace gpulet::testing
