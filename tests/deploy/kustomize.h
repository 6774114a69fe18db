// Renders a kustomization under the source tree with `kubectl kustomize` (GPULET_KUBECTL picks
// another binary), as a user's `kubectl apply -k` would see it. For the tests in tests/deploy.
#pragma once

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <string>
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

}  // namespace gpulet::testing
