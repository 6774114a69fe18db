// gpulet config-sync: follows the node's `nvidia.com/device-plugin.config` label and the named
// configs in a ConfigMap, and keeps the chosen config in a local file that `gpulet node/plugin
// --config FILE` reloads on change (see src/k8s/node_config.h).
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "common/signals.h"
#include "k8s/node_config.h"

namespace gpulet::cli {
namespace {

struct ConfigSyncFlags {
  std::string node_name;
  std::string configmap;  // NS/NAME
  std::string label = k8s::kConfigLabel;
  std::string default_config = "default";
  std::string output;
  std::string kubeconfig;
  bool once = false;
};

int RunConfigSync(const ConfigSyncFlags& f) {
  const size_t slash = f.configmap.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == f.configmap.size()) {
    return ReportError(
        {ErrorCode::kUsage, "--configmap: want NAMESPACE/NAME, got \"" + f.configmap + "\""});
  }
  Result<k8s::ClusterAccess> access = k8s::ResolveClusterAccess(f.kubeconfig);
  if (!access.ok()) return ReportError(access.status());
  k8s::Client client(*access);
  k8s::NodeConfigOptions o;
  o.node_name = f.node_name;
  o.configmap_namespace = f.configmap.substr(0, slash);
  o.configmap_name = f.configmap.substr(slash + 1);
  o.label = f.label;
  o.default_config = f.default_config;
  o.output_path = f.output;
  k8s::NodeConfigSync sync(client, o);
  if (f.once) {
    Result<k8s::ConfigChoice> c = sync.SyncOnce();
    return c.ok() ? 0 : ReportError(c.status());
  }
  // SIGTERM/SIGINT stop the watchers; blocked here so every thread inherits the mask.
  k8s::StopSignal stop;
  SignalThread signals(StopSignals::Block(), nullptr, [&stop] { stop.Stop(); });
  spdlog::info("event=config_sync_start node={} configmap={} label={} default={} file={}",
               o.node_name, f.configmap, o.label, o.default_config, o.output_path);
  sync.Run(stop);
  return 0;
}

}  // namespace

void RegisterConfigSync(CLI::App& app, GlobalOptions& /*global*/, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "config-sync",
      "Write the config named by the node's nvidia.com/device-plugin.config label (from a "
      "ConfigMap of named configs) to a file, and keep it current");
  auto f = std::make_shared<ConfigSyncFlags>();
  cmd->add_option("--node-name", f->node_name, "This node's Kubernetes name")
      ->envname("NODE_NAME")
      ->required();
  cmd->add_option("--configmap", f->configmap, "NAMESPACE/NAME of the ConfigMap of named configs")
      ->envname("GPULET_CONFIGMAP")
      ->required();
  cmd->add_option("--output", f->output, "File to write the chosen config to")
      ->envname("GPULET_CONFIG_OUTPUT")
      ->required();
  cmd->add_option("--label", f->label, "Node label that names the config")
      ->envname("GPULET_CONFIG_LABEL")
      ->capture_default_str();
  cmd->add_option("--default", f->default_config, "Config name for nodes without the label")
      ->envname("GPULET_DEFAULT_CONFIG")
      ->capture_default_str();
  cmd->add_option("--kubeconfig", f->kubeconfig, "Kubeconfig file (default: in-cluster)")
      ->envname("KUBECONFIG");
  cmd->add_flag("--once", f->once, "Write once and exit (init containers)");
  cmd->callback([f, &exit_code] { exit_code = RunConfigSync(*f); });
}

}  // namespace gpulet::cli
