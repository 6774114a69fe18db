// `gpulet doctor`: the new-node checklist. Each check explains, in order, one precondition for
// GPUs to be schedulable (from the seed and the known failure modes) and says how to fix it:
//   driver → device-nodes → container-runtime → kubelet → plugin-registration → gpu-health →
//   mig-strategy → mps → kubernetes (with API access) → dra-api → cdi → dra-resources (where the
//   DRA driver runs or is about to).
// Every path is injectable so tests run the checks against a simulated node and fake trees. The
// checks only read; none changes the node.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "gpu/inventory.h"
#include "gpu/nvml.h"

namespace gpulet::k8s {
class Client;
}

namespace gpulet::doctor {

enum class Verdict { kPass, kWarn, kFail, kSkip };
const char* VerdictName(Verdict v);  // "PASS", "WARN", "FAIL", "SKIP"

struct Check {
  std::string id;  // "driver", "device-nodes", …
  Verdict verdict = Verdict::kPass;
  std::string detail;  // what was found
  std::string fix;     // what to do (empty for PASS/SKIP)
};

// What opening the driver gave (the caller runs OpenNode and Discover).
struct DriverState {
  Status load;                      // loading + nvmlInit
  std::shared_ptr<gpu::Nvml> nvml;  // set when load is ok
  Status discover;                  // gpu::Discover
  std::optional<gpu::Inventory> inventory;
};

struct DoctorOptions {
  std::string dev_root = "/dev";
  std::vector<std::string> cdi_dirs = {"/etc/cdi", "/var/run/cdi"};
  std::vector<std::string> runtime_configs = {"/etc/containerd/config.toml",
                                              "/etc/docker/daemon.json", "/etc/crio/crio.conf"};
  std::string device_plugin_path = "/var/lib/kubelet/device-plugins";
  std::string kubelet_checkpoint;  // empty: <device_plugin_path>/kubelet_internal_checkpoint
  std::string mps_root = "/run/nvidia/mps";
  std::optional<config::Config> config;  // gpulet's config (MIG strategy, MPS); absent: defaults
  std::string node_name;
  const k8s::Client* api = nullptr;  // null: the kubernetes check is skipped

  // DRA (`gpulet dra`, driver gpu.gpulet.io). The DRA checks run when the driver's registration
  // socket (gpu.gpulet.io-*.sock) is in plugins_registry, or when `dra` says so (true: check the
  // prerequisites before deploying it; false: never).
  std::string plugins_registry = "/var/lib/kubelet/plugins_registry";
  std::optional<bool> dra;
  // Where the driver writes its CDI specs: the runtime must read CDI specs from there.
  std::string cdi_root = "/var/run/cdi";
};

std::vector<Check> RunChecks(const DriverState& driver, const DoctorOptions& options);

// The individual checks, for tests and reuse.
Check CheckDriver(const DriverState& driver);
Check CheckDeviceNodes(const DriverState& driver, const std::string& dev_root);
Check CheckContainerRuntime(const DoctorOptions& options);
Check CheckKubelet(const std::string& device_plugin_path);
Check CheckPluginRegistration(const std::string& device_plugin_path, const std::string& checkpoint);
Check CheckGpuHealth(const DriverState& driver);
Check CheckMigStrategy(const std::optional<gpu::Inventory>& inventory,
                       const std::optional<config::Config>& config);
Check CheckMps(const std::optional<config::Config>& config, const std::string& mps_root);
Check CheckKubernetes(const k8s::Client* api, const std::string& node_name);
// DRA prerequisites (SKIP where the DRA checks do not run, see DoctorOptions::dra):
//   dra-api        the API server serves resource.k8s.io/v1 (discovery of the group);
//   cdi            the container runtime whose config is readable has CDI on and reads cdi_root
//                  (containerd: enable_cdi/cdi_spec_dirs of the CRI plugin, on by default from
//                  config version 3 / containerd 2.0; CRI-O: cdi_spec_dirs, CDI always on);
//   dra-resources  no extended resource is served on this node by both the device plugin (its
//                  sockets and the config's advertised names) and a DeviceClass of gpu.gpulet.io
//                  (extendedResourceName; without API access, the deploy/overlays/dra classes'
//                  nvidia.com/gpu and nvidia.com/mig-*).
Check CheckDraApi(const DoctorOptions& options);
Check CheckCdi(const DoctorOptions& options);
Check CheckDraResources(const DoctorOptions& options);

bool AnyFailed(const std::vector<Check>& checks);
std::string FormatText(const std::vector<Check>& checks);
nlohmann::json ToJson(const std::vector<Check>& checks);

}  // namespace gpulet::doctor
