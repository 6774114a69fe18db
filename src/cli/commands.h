// Wiring shared by gpulet's subcommands. Each subcommand lives in its own cmd_<name>.cc and
// exposes one Register function, listed in main.cc. A command's callback stores its exit code in
// `exit_code`; main returns it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "gpu/inventory.h"
#include "gpu/nvml.h"

namespace gpulet::cli {

// Flags every command accepts (each with an environment variable).
struct GlobalOptions {
  std::string simulate;      // --simulate FIXTURE (name or path) / GPULET_SIMULATE
  std::string sim_state;     // --sim-state DIR / GPULET_SIM_STATE
  std::string nvml_library;  // --nvml-library PATH / GPULET_NVML_LIBRARY
  std::string log_level = "info";   // --log-level / GPULET_LOG_LEVEL
  std::string log_format = "text";  // --log-format text|json / GPULET_LOG_FORMAT
  // A long-running agent's body (dra, node, plugin, exporter), set by its command's callback and
  // run by main once the command line's parser is freed: CLI11 keeps every subcommand's options,
  // a few hundred KiB the agent would otherwise hold for its whole life. Its result is the exit
  // code.
  std::function<int()> agent;
};

// An open NVML session plus where discovery should look, for the real driver or a simulated node.
struct NodeContext {
  std::shared_ptr<gpu::Nvml> nvml;
  gpu::DiscoverOptions discover;
  bool simulated = false;
  std::string fixture_path;  // simulated only
  std::string sim_state_dir; // simulated only
};

// Opens the driver named by the global options: with --simulate, prepares the simulated node
// (fixture validated, state directory and fake sysfs written) and loads the simulated library.
Result<NodeContext> OpenNode(const GlobalOptions& global);

// A node opened and discovered: the NVML session and the Inventory read through it.
struct DiscoveredNode {
  NodeContext context;
  gpu::Inventory inventory;
};
// OpenNode, then gpu::Discover; the first error is returned.
Result<DiscoveredNode> DiscoverNode(const GlobalOptions& global);

// A duration flag: "500ms", "30s", "5m", "1h", or "0" (a unit is required otherwise, as in Go's
// time.ParseDuration that NVIDIA's tools use). Errors are kUsage naming `name`.
Result<std::chrono::milliseconds> ParseDuration(const std::string& name, const std::string& v);

// Prints "gpulet: error: <message>" to stderr and returns the status's exit code.
int ReportError(const Status& status);

void RegisterVersion(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterInfo(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterSim(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterPlugin(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterExporter(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterNode(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterSlurm(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterConfigSync(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterQuota(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterDoctor(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterMig(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterBroker(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterLabels(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterReplay(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterExtender(CLI::App& app, GlobalOptions& global, int& exit_code);
void RegisterDra(CLI::App& app, GlobalOptions& global, int& exit_code);

}  // namespace gpulet::cli
