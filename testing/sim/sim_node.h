// Test support (GoogleTest only): a simulated node in a fresh temp directory, loaded through the
// real dlopen path. Used by the gpu, metrics and mig tests; it lives with the simulator, not in
// the gpu seam, so nothing in src/ pulls in gtest or the simulator.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>

#include "gpu/inventory.h"
#include "gpu/nvml.h"
#include "sim/simulation.h"

namespace gpulet::gpu::testing {

inline std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-gpu-XXXXXX";
  char* dir = mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

struct SimNode {
  sim::SimulatedNode node;
  std::shared_ptr<Nvml> nvml;
  DiscoverOptions options;
};

// Prepares `fixture` (name or path) in a new state dir and loads the simulated driver.
inline Result<SimNode> OpenSimNode(const std::string& fixture) {
  Result<sim::SimulatedNode> node = sim::PrepareSimulation(fixture, MakeTempDir());
  if (!node.ok()) return node.status();
  Result<std::shared_ptr<Nvml>> nvml = Nvml::Load(node->library_path);
  if (!nvml.ok()) return nvml.status();
  SimNode s{*node, *nvml, {}};
  s.options.sysfs_root = node->sysfs_root;
  s.options.procfs_root = node->procfs_root;
  return s;
}

}  // namespace gpulet::gpu::testing
