// gpulet node: the device plugin and the metrics exporter in one process, over one NVML session
// and one discovery (what the DaemonSet runs). Flags are the union of `plugin` and `exporter`.
#include <spdlog/spdlog.h>

#include <memory>

#include "cli/agents.h"
#include "cli/commands.h"

namespace gpulet::cli {

void RegisterNode(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "node", "Run the device plugin and the metrics exporter together (one NVML session)");
  auto plugin = std::make_shared<PluginArgs>();
  auto exporter_flags = std::make_shared<ExporterFlags>();
  std::function<void()> finish = AddPluginOptions(cmd, plugin.get());
  AddExporterOptions(cmd, exporter_flags.get());
  cmd->callback([&global, &exit_code, plugin, exporter_flags, finish] {
    finish();
    std::unique_ptr<metrics::Exporter> exporter;
    CompanionAgent companion;
    companion.start = [&exporter, exporter_flags](const NodeContext& node,
                                                   const gpu::Inventory& inventory) -> Status {
      auto started = StartExporter(node.nvml, inventory, *exporter_flags);
      if (!started.ok()) return started.status();
      exporter = std::move(started).value();
      spdlog::info("event=node_exporter_started address={}", exporter_flags->address);
      return Status::Ok();
    };
    companion.reload = [&exporter] {
      if (exporter) (void)exporter->ReloadCounters();  // logged; old counters stay on error
    };
    companion.stop = [&exporter] {
      if (exporter) exporter->Stop();
    };
    exit_code = RunPlugin(global, *plugin, &companion);
  });
}

}  // namespace gpulet::cli
