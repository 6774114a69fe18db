// gpulet node: the device plugin and the metrics exporter in one process, over one NVML session
// and one discovery (what the DaemonSet runs). Flags are the union of `plugin` and `exporter`.
#include <spdlog/spdlog.h>

#include <memory>
#include <mutex>

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
    // The exporter is replaced when the plugin's rescan finds other GPUs or MIG devices; the
    // SIGHUP thread (reload) and the manager thread (inventory_changed) reach it under `mu`.
    std::mutex mu;
    std::unique_ptr<metrics::Exporter> exporter;
    std::shared_ptr<gpu::Nvml> nvml;
    CompanionAgent companion;
    companion.start = [&](const NodeContext& node, const gpu::Inventory& inventory) -> Status {
      std::lock_guard<std::mutex> lock(mu);
      auto started = StartExporter(node.nvml, inventory, *exporter_flags);
      if (!started.ok()) return started.status();
      exporter = std::move(started).value();
      nvml = node.nvml;
      spdlog::info("event=node_exporter_started address={}", exporter_flags->address);
      return Status::Ok();
    };
    companion.reload = [&] {
      std::lock_guard<std::mutex> lock(mu);
      if (exporter) (void)exporter->ReloadCounters();  // logged; old counters stay on error
    };
    companion.inventory_changed = [&](const gpu::Inventory& inventory) {
      std::lock_guard<std::mutex> lock(mu);
      // Series follow the new devices: a new exporter over the same NVML session and address.
      // Scrapes in the few milliseconds between the two get a refused connection, which
      // Prometheus records as one failed scrape.
      if (exporter) exporter->Stop();
      exporter.reset();
      auto started = StartExporter(nvml, inventory, *exporter_flags);
      if (!started.ok()) {
        spdlog::error("event=node_exporter_restart_failed error=\"{}\"", started.status().message());
        return;
      }
      exporter = std::move(started).value();
      spdlog::info("event=node_exporter_restarted reason=inventory_changed gpus={} mig_devices={}",
                   inventory.gpus.size(), inventory.MigDeviceCount());
    };
    companion.stop = [&] {
      std::lock_guard<std::mutex> lock(mu);
      if (exporter) exporter->Stop();
    };
    exit_code = RunPlugin(global, *plugin, &companion);
  });
}

}  // namespace gpulet::cli
