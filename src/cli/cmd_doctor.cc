// gpulet doctor: the new-node checklist (src/doctor/doctor.h), PASS/WARN/FAIL with a fix for
// each; exit 1 when a check fails; --output json for automation.
#include <cstdio>
#include <sstream>

#include "cli/commands.h"
#include "config/config.h"
#include "doctor/doctor.h"
#include "k8s/access.h"
#include "k8s/client.h"

namespace gpulet::cli {
namespace {

struct DoctorFlags {
  std::string output = "text";
  std::string dev_root = "/dev";
  std::string cdi_dirs = "/etc/cdi,/var/run/cdi";
  std::vector<std::string> runtime_configs = {"/etc/containerd/config.toml",
                                              "/etc/docker/daemon.json", "/etc/crio/crio.conf",
                                              "/etc/crio/crio.conf.d"};
  std::string device_plugin_path = "/var/lib/kubelet/device-plugins";
  std::string kubelet_checkpoint;
  std::string mps_root = "/run/nvidia/mps";
  std::string config;
  std::string node_name;
  std::string kubeconfig;
  bool dra = false;
  std::string plugins_registry = "/var/lib/kubelet/plugins_registry";
  std::string cdi_root = "/var/run/cdi";
};

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int RunDoctor(const GlobalOptions& global, const DoctorFlags& f) {
  doctor::DoctorOptions o;
  o.dev_root = f.dev_root;
  o.cdi_dirs = SplitComma(f.cdi_dirs);
  o.runtime_configs = f.runtime_configs;
  o.device_plugin_path = f.device_plugin_path;
  o.kubelet_checkpoint = f.kubelet_checkpoint;
  o.mps_root = f.mps_root;
  o.plugins_registry = f.plugins_registry;
  o.cdi_root = f.cdi_root;
  if (f.dra) o.dra = true;  // else: on where the DRA driver's registration socket is
  if (!f.config.empty()) {
    Result<config::Config> c = config::LoadConfigFile(f.config);
    if (!c.ok()) return ReportError(c.status());
    o.config = *c;
  }
  std::unique_ptr<k8s::Client> client;
  if (!f.node_name.empty()) {
    Result<k8s::ClusterAccess> access = k8s::ResolveClusterAccess(f.kubeconfig);
    if (access.ok()) {
      client = std::make_unique<k8s::Client>(*access);
      o.api = client.get();
      o.node_name = f.node_name;
    } else {
      std::fprintf(stderr, "gpulet: warning: no API access: %s\n",
                   access.status().message().c_str());
    }
  }
  doctor::DriverState driver;
  Result<NodeContext> node = OpenNode(global);
  driver.load = node.status();
  if (node.ok()) {
    driver.nvml = node->nvml;
    Result<gpu::Inventory> inv = gpu::Discover(*node->nvml, node->discover);
    driver.discover = inv.status();
    if (inv.ok()) driver.inventory = *inv;
  }
  std::vector<doctor::Check> checks = doctor::RunChecks(driver, o);
  if (f.output == "json") {
    std::printf("%s\n", doctor::ToJson(checks).dump(2).c_str());
  } else {
    std::fputs(doctor::FormatText(checks).c_str(), stdout);
  }
  return doctor::AnyFailed(checks) ? 1 : 0;
}

}  // namespace

void RegisterDoctor(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "doctor", "Check this node's GPU preconditions in order and say how to fix each failure");
  auto f = std::make_shared<DoctorFlags>();
  cmd->add_option("-o,--output", f->output, "text|json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->add_option("--dev-root", f->dev_root, "Where the NVIDIA device nodes are")
      ->envname("GPULET_DEV_ROOT")
      ->capture_default_str();
  cmd->add_option("--cdi-dir", f->cdi_dirs, "CDI spec directories (comma-separated)")
      ->envname("GPULET_CDI_DIRS")
      ->capture_default_str();
  cmd->add_option("--runtime-config", f->runtime_configs,
                  "Container runtime config files to look for the nvidia runtime in")
      ->capture_default_str();
  cmd->add_option("--device-plugin-path", f->device_plugin_path,
                  "The kubelet's device-plugins directory")
      ->envname("DEVICE_PLUGIN_PATH")
      ->capture_default_str();
  cmd->add_option(
      "--kubelet-checkpoint", f->kubelet_checkpoint,
      "The kubelet's device checkpoint (default <device-plugin-path>/kubelet_internal_checkpoint)");
  cmd->add_option("--mps-root", f->mps_root, "MPS root directory")
      ->envname("GPULET_MPS_ROOT")
      ->capture_default_str();
  cmd->add_option("--config", f->config, "gpulet's config file (MIG strategy, MPS)")
      ->envname("CONFIG_FILE");
  cmd->add_option("--node-name", f->node_name,
                  "Kubernetes node name: enables the capacity check through the API")
      ->envname("NODE_NAME");
  cmd->add_option("--kubeconfig", f->kubeconfig, "Kubeconfig file (default: in-cluster)")
      ->envname("KUBECONFIG");
  cmd->add_flag("--dra", f->dra,
                "Check the DRA prerequisites (resource.k8s.io/v1, CDI in the runtime, no extended "
                "resource from both the device plugin and DRA) even before `gpulet dra` runs here");
  cmd->add_option("--plugins-registry", f->plugins_registry,
                  "The kubelet's plugin registry: the DRA checks run when gpulet's DRA driver is "
                  "registered there")
      ->capture_default_str();
  cmd->add_option("--dra-cdi-root", f->cdi_root,
                  "Where gpulet dra writes its CDI specs (the runtime must read them there)")
      ->capture_default_str();
  cmd->callback([&global, f, &exit_code] { exit_code = RunDoctor(global, *f); });
}

}  // namespace gpulet::cli
