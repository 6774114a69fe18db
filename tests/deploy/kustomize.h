// Renders a kustomization under the source tree with `kubectl kustomize` (GPULET_KUBECTL picks
// another binary), as a user's `kubectl apply -k` would see it. For the tests in tests/deploy.
#pragma once

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../cli/run_command.h"

namespace gpulet::testing {

inline std::string Kubectl() {
  const char* k = std::getenv("GPULET_KUBECTL");
  return k != nullptr && *k != '\0' ? k : "kubectl";
}

// `dir` relative to the source tree, e.g. "deploy/overlays/mps". stderr is dropped: newer
// kustomize warns about the v2-compatible fields the overlays use.
inline std::vector<YAML::Node> RenderKustomization(const std::string& dir) {
  CommandResult r = RunCommand(Kubectl() + " kustomize " + std::string(GPULET_SOURCE_DIR) + "/" +
                               dir + " 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << "kubectl kustomize " << dir << ":\n" << r.output;
  if (r.exit_code != 0) return {};
  return YAML::LoadAll(r.output);
}

// Lookups in rendered manifests.
inline std::vector<YAML::Node> OfKind(const std::vector<YAML::Node>& docs,
                                      const std::string& kind) {
  std::vector<YAML::Node> out;
  for (const YAML::Node& d : docs) {
    if (d["kind"].as<std::string>() == kind) out.push_back(d);
  }
  return out;
}

// The object of `kind` named `name`, or a null node.
inline YAML::Node Find(const std::vector<YAML::Node>& docs, const std::string& kind,
                       const std::string& name) {
  for (const YAML::Node& d : OfKind(docs, kind)) {
    if (d["metadata"]["name"].as<std::string>() == name) return d;
  }
  return YAML::Node();
}

// The item of a list of named items (containers, volumes, env) named `name`, or a null node.
inline YAML::Node Named(const YAML::Node& list, const std::string& name) {
  for (const YAML::Node& item : list) {
    if (item["name"].as<std::string>() == name) return item;
  }
  return YAML::Node();
}

inline std::set<std::string> Strings(const YAML::Node& list) {
  std::set<std::string> out;
  for (const YAML::Node& s : list) out.insert(s.as<std::string>());
  return out;
}

// The host paths `container` of `pod` (a PodSpec) mounts: host path -> (mountPath, readOnly).
inline std::map<std::string, std::pair<std::string, bool>> MountedHostPaths(
    const YAML::Node& pod, const YAML::Node& container) {
  std::map<std::string, std::string> host_path_of_volume;
  for (const YAML::Node& v : pod["volumes"]) {
    if (v["hostPath"])
      host_path_of_volume[v["name"].as<std::string>()] = v["hostPath"]["path"].as<std::string>();
  }
  std::map<std::string, std::pair<std::string, bool>> mounted;
  for (const YAML::Node& m : container["volumeMounts"]) {
    auto it = host_path_of_volume.find(m["name"].as<std::string>());
    if (it == host_path_of_volume.end()) continue;
    mounted[it->second] = {m["mountPath"].as<std::string>(),
                           m["readOnly"].IsDefined() && m["readOnly"].as<bool>()};
  }
  return mounted;
}

}  // namespace gpulet::testing
