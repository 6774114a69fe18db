// gpulet node: the device plugin and the metrics exporter in one process, over one NVML session
// and one discovery (what the DaemonSet runs). Flags are the union of `plugin` and `exporter`.
// With --dra the kubelet DRA plugin (driver gpu.gpulet.io, `gpulet dra`'s flags as --dra-*) serves
// the GPUs instead of the device plugin, beside the same exporter: one node must not offer the same
// GPUs both as nvidia.com/gpu and as DRA devices (docs/dra-migration.md).
#include <spdlog/spdlog.h>

#include <memory>

#include "cli/agents.h"
#include "cli/commands.h"

namespace gpulet::cli {

namespace {

// The agent `gpulet node` runs once its command line is parsed: the device plugin (or, with
// --dra, the DRA driver) with the exporter beside it.
int RunNode(const GlobalOptions& global, const std::shared_ptr<PluginArgs>& plugin,
            const std::shared_ptr<ExporterFlags>& exporter_flags,
            const std::shared_ptr<DraArgs>& dra, bool use_dra) {
  if (plugin->kubeconfig.empty()) plugin->kubeconfig = exporter_flags->kubeconfig;
  // The exporter, on the NVML session and inventory of the agent it runs beside. Under the
  // device plugin it is replaced when the plugin's rescan finds other GPUs or MIG devices; the
  // SIGHUP thread (reload) and the manager thread (inventory_changed) reach it through the host.
  std::unique_ptr<ExporterHost> host;
  CompanionAgent companion;
  companion.start = [&](const NodeContext& node, const gpu::Inventory& inventory) -> Status {
    host = std::make_unique<ExporterHost>(node.nvml, *exporter_flags, "node_exporter");
    return host->Start(inventory);
  };
  companion.reload = [&] {
    if (host) host->ReloadCounters();
  };
  companion.stop = [&] {
    if (host) host->Stop();
  };
  if (use_dra) {
    spdlog::info("event=node_dra (the device plugin is not started: the DRA driver serves this "
                 "node's GPUs)");
    DraArgs d = *dra;
    d.node_name = plugin->node_name;
    d.kubeconfig = plugin->kubeconfig;
    d.device_plugin_path = plugin->plugin_dir;
    return RunDra(global, std::move(d), &companion);
  }
  companion.memory_pool = exporter_flags->memory_pool;
  companion.inventory_changed = [&](const gpu::Inventory& inventory) {
    host->Replace(inventory);
  };
  return RunPlugin(global, *plugin, &companion);
}

}  // namespace

void RegisterNode(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "node", "Run the device plugin and the metrics exporter together (one NVML session)");
  auto plugin = std::make_shared<PluginArgs>();
  auto exporter_flags = std::make_shared<ExporterFlags>();
  // The exporter's options first: its --kubeconfig serves the plugin too (memory pool).
  AddExporterOptions(cmd, exporter_flags.get());
  std::function<void()> finish = AddPluginOptions(cmd, plugin.get());
  auto dra = std::make_shared<DraArgs>();
  auto use_dra = std::make_shared<bool>(false);
  cmd->add_flag("--dra", *use_dra,
                "Serve the GPUs through the kubelet's DRA plugin (driver gpu.gpulet.io, "
                "resource.k8s.io/v1) instead of the device plugin; the --dra-* flags are "
                "`gpulet dra`'s")
      ->envname("GPULET_DRA");
  AddDraOptions(cmd, *dra, "dra-");
  // The plugin's memory-pool publications, as the exporter's gauges.
  exporter_flags->memory_pool = std::make_shared<metrics::MemoryPoolGauges>();
  (void)exit_code;  // the agent's result is main's (GlobalOptions::agent)
  cmd->callback([&global, plugin, exporter_flags, finish, dra, use_dra] {
    finish();
    global.agent = [&global, plugin, exporter_flags, dra, use_dra] {
      return RunNode(global, plugin, exporter_flags, dra, *use_dra);
    };
  });
}

}  // namespace gpulet::cli
