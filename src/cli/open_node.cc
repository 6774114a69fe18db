// What every command that touches the node shares: opening the driver (real or simulated),
// discovering the node, reporting errors, and flag durations.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/commands.h"
#include "common/duration.h"
#include "sim/simulation.h"

namespace gpulet::cli {

int ReportError(const Status& status) {
  std::fprintf(stderr, "gpulet: error: %s\n", status.message().c_str());
  return status.exit_code();
}

Result<NodeContext> OpenNode(const GlobalOptions& global) {
  NodeContext ctx;
  std::string library = global.nvml_library;
  if (!global.simulate.empty()) {
    Result<sim::SimulatedNode> node = sim::PrepareSimulation(global.simulate, global.sim_state);
    if (!node.ok()) return node.status();
    ctx.simulated = true;
    ctx.fixture_path = node->fixture_path;
    ctx.sim_state_dir = node->state_dir;
    ctx.discover.sysfs_root = node->sysfs_root;
    ctx.discover.procfs_root = node->procfs_root;
    if (library.empty()) library = node->library_path;
    // Loud on purpose: a stray GPULET_SIMULATE in a real DaemonSet would advertise fake GPUs.
    const char* env = std::getenv("GPULET_SIMULATE");
    const bool from_env = env != nullptr && global.simulate == env;
    spdlog::warn(
        "event=simulated_driver fixture={} set_by={} msg=\"SIMULATED GPUs from a fixture, not the "
        "real driver\"",
        ctx.fixture_path, from_env ? "GPULET_SIMULATE" : "--simulate");
  }
  if (library.empty()) library = gpu::DefaultNvmlLibraryPath();
  Result<std::shared_ptr<gpu::Nvml>> nvml = gpu::Nvml::Load(library);
  if (!nvml.ok()) return nvml.status();
  ctx.nvml = std::move(nvml).value();
  spdlog::debug("event=nvml_loaded library={} simulated={}", library, ctx.simulated);
  return ctx;
}

Result<DiscoveredNode> DiscoverNode(const GlobalOptions& global) {
  Result<NodeContext> node = OpenNode(global);
  if (!node.ok()) return node.status();
  Result<gpu::Inventory> inv = gpu::Discover(*node->nvml, node->discover);
  if (!inv.ok()) return inv.status();
  return DiscoveredNode{std::move(node).value(), std::move(inv).value()};
}

Result<std::chrono::milliseconds> ParseDuration(const std::string& name, const std::string& v) {
  // The one grammar (common/duration.h); flag errors keep the "flag: …" usage shape.
  Result<std::chrono::milliseconds> d = gpulet::ParseDuration(v);
  if (!d.ok()) return Status(ErrorCode::kUsage, name + ": " + d.status().message());
  return d;
}

}  // namespace gpulet::cli
