// gpulet dra: the kubelet DRA plugin of driver gpu.gpulet.io (src/dra/plugin.h): registration in
// the kubelet's plugins_registry, DRAPlugin v1 and v1beta1, the device health stream; claims are
// read from the API server and prepared on this node's GPUs by the node preparer
// (src/dra/node_preparer.h: CDI specs, memory shares, dynamic MIG). Health comes from the same
// NVML health watch as the device plugin's; the node's ResourceSlices are published by
// src/dra/publisher.h.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/agents.h"
#include "cli/commands.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/signals.h"
#include "dra/health_stream.h"
#include "dra/mps_control.h"
#include "dra/names.h"
#include "dra/node_preparer.h"
#include "dra/plugin.h"
#include "dra/publisher.h"
#include "gpu/health.h"
#include "k8s/access.h"
#include "k8s/client.h"
#include "k8s/quantity.h"
#include "mig/driver.h"
#include "mig/layout_lock.h"
#include "node/health_watch.h"

namespace gpulet::cli {

void AddDraOptions(CLI::App* cmd, DraArgs& a, const std::string& prefix) {
  const auto flag = [&prefix](const char* name) { return "--" + prefix + name; };
  // Inside `gpulet node` the node name and the API server are the device plugin's and the
  // exporter's (--node-name, --kubeconfig), shared.
  if (prefix.empty()) {
    cmd->add_option(flag("node-name"), a.node_name,
                    "This node's name: the ResourceSlice pool and the node claims must be "
                    "allocated to (default: the host name)")
        ->envname("NODE_NAME");
    cmd->add_option(flag("kubeconfig"), a.kubeconfig,
                    "kubeconfig file for the API server (default: in-cluster service account)")
        ->envname("KUBECONFIG");
  }
  cmd->add_option(flag("plugins-registry"), a.registry_dir,
                  "The kubelet's plugin registration directory")
      ->envname("GPULET_DRA_PLUGINS_REGISTRY")
      ->capture_default_str();
  cmd->add_option(flag("plugin-dir"), a.plugins_dir,
                  "The kubelet's plugins directory (the DRA socket goes in <dir>/gpu.gpulet.io/)")
      ->envname("GPULET_DRA_PLUGIN_DIR")
      ->capture_default_str();
  cmd->add_option(flag("cdi-root"), a.cdi_root, "Where the per-claim CDI specs are written")
      ->envname("GPULET_CDI_ROOT")
      ->capture_default_str();
  cmd->add_option(flag("driver-root"), a.driver_root,
                  "Root of the NVIDIA driver's files (libraries, binaries, device nodes)")
      ->envname("NVIDIA_DRIVER_ROOT")
      ->capture_default_str();
  cmd->add_option(flag("host-driver-root"), a.host_driver_root,
                  "The driver root as the container runtime on the host sees it (the CDI specs' "
                  "host paths; default: --driver-root)")
      ->envname("NVIDIA_HOST_DRIVER_ROOT");
  cmd->add_option(flag("cuda-library"), a.cuda_library,
                  "Host path of libgpulet-cuda.so, for memory shares (empty: shares are refused)")
      ->envname("GPULET_CUDA_LIBRARY");
  cmd->add_option(flag("plugin-state-dir"), a.plugin_state_dir,
                  "The kubelet plugin's checkpoint and lock, shared by the instances of a rolling "
                  "update (default: <plugin-dir>/gpu.gpulet.io)")
      ->envname("GPULET_DRA_PLUGIN_STATE_DIR");
  cmd->add_option(flag("boot-id-file"), a.boot_id_file,
                  "Where the boot ID is read (the checkpoint of another boot is set aside)")
      ->envname("GPULET_BOOT_ID_FILE")
      ->capture_default_str();
  cmd->add_option(flag("state-dir"), a.state_dir,
                  "The device preparer's state (per-claim records, memory-limit directories; "
                  "default: the preparer's, /run/gpulet/dra)")
      ->envname("GPULET_DRA_STATE_DIR");
  cmd->add_option(flag("instance"), a.instance,
                  "This pod's UID, for a rolling update: per-instance socket names "
                  "(<driver>-<uid>-reg.sock, dra-<uid>.sock) beside the other instance")
      ->envname("POD_UID");
  cmd->add_option(flag("device-status"), a.device_status,
                  "Write status.devices to each prepared claim (needs resourceclaims/status patch)")
      ->envname("GPULET_DRA_DEVICE_STATUS")
      ->capture_default_str();
  cmd->add_option(flag("publish-slices"), a.publish_slices,
                  "Publish this node's ResourceSlices (GPUs, memory shares, MIG placements)")
      ->envname("GPULET_DRA_PUBLISH_SLICES")
      ->capture_default_str();
  cmd->add_option(flag("memory-unit"), a.memory_unit,
                  "The step of GPU memory shares (consumable capacity), a quantity")
      ->envname("GPULET_DRA_MEMORY_UNIT")
      ->capture_default_str();
  cmd->add_option(flag("placement-policy"), a.placement_policy,
                  "The device order in the slices (a src/placement policy)")
      ->envname("GPULET_DRA_PLACEMENT_POLICY")
      ->capture_default_str();
  cmd->add_option(flag("mps-control-binary"), a.mps_control_binary,
                  "The MPS control program started for claims whose config asks for MPS (a "
                  "path, or a name looked up in PATH)")
      ->capture_default_str();
  cmd->add_option(flag("mps-root"), a.mps_root,
                  "Where each MPS-configured claim's daemon keeps its pipe and log directories "
                  "(mounted into the claim's containers)")
      ->capture_default_str();
  if (prefix.empty()) {
    cmd->add_option(flag("device-plugin-path"), a.device_plugin_path,
                    "The kubelet's device-plugin directory, where a device plugin serving "
                    "nvidia.com/gpu or nvidia.com/mig-* is looked for (see --allow-device-plugin)")
        ->envname("GPULET_DEVICE_PLUGIN_PATH")
        ->capture_default_str();
  }
  cmd->add_option(flag("allow-device-plugin"), a.allow_device_plugin,
                  "Start even though a device plugin serves nvidia.com/gpu or nvidia.com/mig-* on "
                  "this node (only where no DeviceClass maps them to this driver)")
      ->envname("GPULET_DRA_ALLOW_DEVICE_PLUGIN")
      ->capture_default_str();
  cmd->add_option(flag("health"), a.health,
                  "Serve the DRAResourceHealth stream (v1 and v1alpha1) from the NVML health watch")
      ->capture_default_str();
}

namespace {

// The live device-plugin sockets in `dir` that serve an extended resource the shipped DeviceClasses
// map to this driver (nvidia-gpu.sock, nvidia-mig-<profile>.sock). Live: it accepts a connection
// (a plugin that died leaves its socket behind, refused).
std::vector<std::string> LiveMappedDevicePlugins(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::optional<std::string> resource =
        dra::DevicePluginSocketResource(e.path().filename().string());
    std::error_code sec;
    if (resource && dra::MappedByShippedDeviceClasses(*resource) &&
        std::filesystem::is_socket(e.symlink_status(sec)) &&
        UnixSocketAccepts(e.path().string())) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int RunDra(const GlobalOptions& global, DraArgs args, const CompanionAgent* companion) {
  LimitMallocArenas();
  if (args.node_name.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) == 0) args.node_name = host;
  }
  if (args.node_name.empty()) {
    return ReportError(Status(ErrorCode::kUsage, "dra: --node-name is required (NODE_NAME)"));
  }
  if (!args.allow_device_plugin && !args.device_plugin_path.empty()) {
    const std::vector<std::string> live = LiveMappedDevicePlugins(args.device_plugin_path);
    if (!live.empty()) {
      std::string names;
      for (const std::string& l : live) names += (names.empty() ? "" : ", ") + l;
      return ReportError(Status(
          ErrorCode::kUsage,
          "dra: a device plugin serves this node's GPUs (" + names +
              "): the DeviceClasses of deploy/overlays/dra map nvidia.com/gpu and "
              "nvidia.com/mig-* to this driver, and one node must not serve them both ways. Move "
              "the node off the device plugin (label gpulet.io/dra=true, docs/dra-migration.md), "
              "or pass --allow-device-plugin where no class maps them"));
    }
  }
  Result<int64_t> unit = k8s::ParseWholeQuantity(args.memory_unit);
  if (!unit.ok() || *unit <= 0) {
    return ReportError(Status(ErrorCode::kUsage,
                              "--memory-unit: " + (unit.ok() ? std::string("must be above 0")
                                                             : unit.status().message())));
  }
  // Before any thread starts: the signals reach only the waiter.
  const StopSignals signals = StopSignals::Block();
  // Every Prepare reads its claim: without the API server the driver would only fail pods.
  Result<k8s::ClusterAccess> access = k8s::ResolveClusterAccess(args.kubeconfig);
  if (!access.ok()) {
    return ReportError(Status(ErrorCode::kUnavailable,
                              "dra: no API server access (--kubeconfig or in-cluster): " +
                                  access.status().message()));
  }
  k8s::Client client(*access);
  Result<NodeContext> node = OpenNode(global);
  if (!node.ok()) return ReportError(node.status());
  Result<gpu::Inventory> discovered = gpu::Discover(*node->nvml, node->discover);
  if (!discovered.ok()) return ReportError(discovered.status());
  auto inventory = std::make_shared<const gpu::Inventory>(std::move(discovered).value());

  dra::NodePreparerOptions po;
  po.node_name = args.node_name;
  po.inventory = *inventory;
  po.nvml = node->nvml;
  po.discover = node->discover;
  po.mig_lock_file = mig::LayoutLockPath(node->sim_state_dir);
  po.cdi_root = args.cdi_root;
  po.driver_root = args.driver_root;
  po.host_driver_root = args.host_driver_root;
  if (!args.state_dir.empty()) po.state_dir = args.state_dir;
  const std::string preparer_state_dir = po.state_dir;
  po.cuda_library = args.cuda_library;
  // One MPS control daemon per claim whose opaque config asks for MPS; without the supervisor
  // such claims are refused with a message naming the claim and its config.
  mps::SupervisorOptions mps_options;
  mps_options.control_binary = args.mps_control_binary;
  mps_options.root = args.mps_root;
  Result<std::shared_ptr<dra::SupervisorMpsControl>> mps =
      dra::SupervisorMpsControl::Create(mps_options, node->nvml);
  if (mps.ok()) {
    po.mps = *mps;
  } else {
    spdlog::warn("event=dra_mps_unavailable root={} error=\"{}\" (MPS configs are refused)",
                 args.mps_root, mps.status().message());
  }
  Result<std::unique_ptr<dra::Preparer>> preparer = dra::MakeNodePreparer(std::move(po));
  if (!preparer.ok()) return ReportError(preparer.status());

  dra::PluginOptions o;
  o.node_name = args.node_name;
  o.registry_dir = args.registry_dir;
  o.plugins_dir = args.plugins_dir;
  o.state_dir = args.plugin_state_dir;
  o.instance = args.instance;
  o.boot_id_path = args.boot_id_file;
  o.write_device_status = args.device_status;
  o.serve_health = args.health;
  dra::DraPlugin plugin(o, &client, preparer->get());

  gpu::HealthBoard board;
  std::unique_ptr<node::HealthWatch> health;
  std::unique_ptr<dra::HealthFeeder> feeder;
  if (args.health) {
    health = std::make_unique<node::HealthWatch>(node->nvml, gpu::HealthMonitorOptions{},
                                                 RealClock(), board);
    Status hs = health->Start(inventory);
    if (!hs.ok()) return ReportError(hs);
    feeder = std::make_unique<dra::HealthFeeder>(plugin, board, inventory);
  }
  // The slices go up before the kubelet can see the driver (it wipes a node's slices when it
  // starts; the publisher's watch puts them back).
  std::unique_ptr<dra::SlicePublisher> publisher;
  if (args.publish_slices) {
    dra::PublisherOptions pub;
    pub.slices.node_name = args.node_name;
    pub.slices.memory_unit_bytes = *unit;
    pub.slices.placement_policy = args.placement_policy;
    pub.slices.sysfs_root = node->discover.sysfs_root;
    publisher = std::make_unique<dra::SlicePublisher>(client, pub);
    Result<std::vector<mig::GpuState>> mig_state = mig::ReadMigState(*node->nvml);
    if (!mig_state.ok()) {
      spdlog::warn("event=dra_mig_state_unread error=\"{}\" (no MIG devices published)",
                   mig_state.status().message());
    } else if (const size_t ours = dra::ForgetDraMadeMigInstances(preparer_state_dir, *mig_state);
               ours > 0) {
      // Made for claims before a restart: not a static layout (their placements stay published).
      spdlog::info("event=dra_mig_instances_of_claims count={}", ours);
    }
    publisher->SetDevices(inventory, mig_state.ok() ? *mig_state : std::vector<mig::GpuState>{});
    Status ps = publisher->Start();
    if (!ps.ok()) return ReportError(ps);
    publisher->FollowHealth(board);
  }
  Status started = plugin.Start();
  if (!started.ok()) return ReportError(started);
  if (feeder) feeder->Start();
  // Stops what runs, the newest first.
  const auto stop_all = [&] {
    if (feeder) feeder->Stop();
    plugin.Stop();
    if (publisher) publisher->Stop();
    if (health) health->Stop();
  };
  // `gpulet node --dra`: the exporter, on the same NVML session and inventory.
  if (companion != nullptr) {
    Status cs = companion->start(*node, *inventory);
    if (!cs.ok()) {
      stop_all();
      return ReportError(cs);
    }
  }
  spdlog::info("event=dra_started node={} gpus={} simulated={}", args.node_name,
               inventory->gpus.size(), node->simulated);
  std::function<void()> reload;
  if (companion != nullptr && companion->reload) reload = companion->reload;
  const int sig = RunUntilStopped(signals, std::chrono::seconds(1), reload, {});
  spdlog::info("event=dra_stopping signal={}", sig);
  if (companion != nullptr && companion->stop) companion->stop();
  stop_all();
  return 0;
}

void RegisterDra(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "dra", "Kubelet DRA plugin for driver gpu.gpulet.io (resource.k8s.io/v1 ResourceClaims)");
  auto args = std::make_shared<DraArgs>();
  AddDraOptions(cmd, *args, "");
  (void)exit_code;  // the agent's result is main's (GlobalOptions::agent)
  cmd->callback([&global, args] {
    global.agent = [&global, args] { return RunDra(global, *args); };
  });
}

}  // namespace gpulet::cli
