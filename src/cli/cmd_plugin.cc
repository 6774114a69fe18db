// gpulet plugin: the kubelet device plugin. Discovers the node, builds the sharing plan from
// flags/env/config file (precedence CLI > environment > file > default), serves one socket per
// resource, registers with the kubelet, watches health, and reloads on SIGHUP or a config change.
// It re-discovers the node every --rescan-interval and on SIGHUP: when the GPUs or MIG devices
// changed (`gpulet mig apply`), it re-plans and restarts only the resources that changed. MPS
// resources get one supervised control daemon each (src/mps), restarted when they change.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/agents.h"
#include "cli/commands.h"
#include "common/clock.h"
#include "common/signals.h"
#include "config/config.h"
#include "deviceplugin/manager.h"
#include "deviceplugin/memory_limits_janitor.h"
#include "deviceplugin/memory_publisher.h"
#include "deviceplugin/resource_server.h"
#include "gpu/health.h"
#include "k8s/access.h"
#include "k8s/client.h"
#include "labels/labels.h"
#include "metrics/memory_pool.h"
#include "mig/layout_lock.h"
#include "mps/supervisor.h"
#include "node/health_watch.h"
#include "node/inventory_watch.h"
#include "node/mps_control.h"
#include "node/rescanner.h"
#include "sharing/plan.h"

namespace gpulet::cli {
namespace {

// As Go's strconv.ParseBool reads upstream's flags and variables (True, TRUE, t, 1, …).
Result<bool> ParseBool(const std::string& name, const std::string& v) {
  if (v.empty()) return true;
  Result<bool> b = config::ParseGoBool(v);
  if (!b.ok()) return Status(ErrorCode::kUsage, name + ": " + b.status().message());
  return *b;
}

// The flags given on the command line or in the environment, as a config overlay.
Result<config::Flags> CliFlags(const PluginArgs& a) {
  config::Flags f;
  auto prefix = [](const char* flag, const Status& s) {
    return Status(ErrorCode::kUsage, std::string(flag) + ": " + s.message());
  };
  if (!a.fail_on_init_error.empty()) {
    Result<bool> b = ParseBool("--fail-on-init-error", a.fail_on_init_error);
    if (!b.ok()) return b.status();
    f.fail_on_init_error = *b;
  }
  if (!a.pass_device_specs.empty()) {
    Result<bool> b = ParseBool("--pass-device-specs", a.pass_device_specs);
    if (!b.ok()) return b.status();
    f.plugin.pass_device_specs = *b;
  }
  if (!a.device_id_strategy.empty()) {
    auto s = config::ParseDeviceIdStrategy(a.device_id_strategy);
    if (!s.ok()) return prefix("--device-id-strategy", s.status());
    f.plugin.device_id_strategy = *s;
  }
  if (!a.device_list_strategy.empty()) {
    auto s = config::ParseDeviceListStrategies(a.device_list_strategy);
    if (!s.ok()) return prefix("--device-list-strategy", s.status());
    f.plugin.device_list_strategy = *s;
  }
  if (!a.mig_strategy.empty()) {
    auto s = config::ParseMigStrategy(a.mig_strategy);
    if (!s.ok()) return prefix("--mig-strategy", s.status());
    f.mig_strategy = *s;
  }
  if (!a.mps_root.empty()) f.plugin.mps_root = a.mps_root;
  if (!a.nvidia_driver_root.empty()) f.nvidia_driver_root = a.nvidia_driver_root;
  if (!a.nvidia_dev_root.empty()) f.nvidia_dev_root = a.nvidia_dev_root;
  if (!a.cdi_annotation_prefix.empty()) f.plugin.cdi_annotation_prefix = a.cdi_annotation_prefix;
  return f;
}

// File (if any) overlaid with CLI/env flags.
Result<config::Config> EffectiveConfig(const PluginArgs& args, const config::Flags& cli) {
  config::Config cfg;
  if (!args.config_file.empty()) {
    Result<config::Config> file = config::LoadConfigFile(args.config_file);
    if (!file.ok()) return file.status();
    cfg = std::move(file).value();
    config::LogWarnings(cfg);
  }
  cfg.flags = config::Overlay(cfg.flags, cli);
  return cfg;
}

constexpr char kDefaultMpsRoot[] = "/run/nvidia/mps";

std::string MpsRoot(const config::Config& cfg) {
  return cfg.flags.plugin.mps_root.value_or(kDefaultMpsRoot);
}

// Rewrites the node-label feature file for the plan being served. A failure is logged, never
// fatal: labels are informational, serving devices is not.
void WriteNodeLabels(const std::string& path, const gpu::Inventory& inventory,
                     const sharing::Plan& plan, const config::Config& cfg) {
  if (path.empty()) return;
  labels::LabelOptions o;
  o.mig_strategy = cfg.flags.mig_strategy.value_or(config::MigStrategy::kNone);
  o.machine = labels::ReadMachineType("/sys/class/dmi/id/product_name");
  o.sharing = &cfg.sharing;
  o.timestamp = static_cast<int64_t>(std::time(nullptr));
  const labels::Labels l = labels::NodeLabels(inventory, plan, o);
  Status s = labels::WriteFeatureFile(path, l);
  if (s.ok()) {
    spdlog::info("event=labels_written path={} labels={}", path, l.size());
  } else {
    spdlog::warn("event=labels_failed path={} error=\"{}\"", path, s.message());
  }
}

Result<deviceplugin::ServingSetup> BuildSetup(const gpu::Inventory& inventory,
                                              const config::Config& cfg,
                                              deviceplugin::ReplicaPolicy policy) {
  Result<sharing::Plan> plan = sharing::BuildPlan(inventory, cfg);
  if (!plan.ok()) return plan.status();
  for (const std::string& note : plan->notes) spdlog::warn("event=plan_note note=\"{}\"", note);
  deviceplugin::ServingSetup setup;
  setup.plan = std::move(plan).value();
  setup.allocate.replica_policy = policy;
  for (const sharing::Resource& r : setup.plan.resources) {
    if (r.sharing != sharing::SharingKind::kMps) continue;
    mps::DaemonPaths paths = mps::PathsFor(MpsRoot(cfg), r.name);
    setup.allocate.mps[r.name] = deviceplugin::MpsMount{paths.pipe_dir, paths.shm_dir};
  }
  const config::Flags& f = cfg.flags;
  deviceplugin::AllocateOptions& o = setup.allocate;
  if (f.plugin.device_list_strategy) o.device_list_strategies = *f.plugin.device_list_strategy;
  o.device_id_strategy = f.plugin.device_id_strategy.value_or(config::DeviceIdStrategy::kUuid);
  o.pass_device_specs = f.plugin.pass_device_specs.value_or(false);
  // As NVIDIA's plugin: the device root defaults to the driver root.
  o.nvidia_dev_root = f.nvidia_dev_root.value_or(f.nvidia_driver_root.value_or("/"));
  if (f.plugin.cdi_annotation_prefix) o.cdi_annotation_prefix = *f.plugin.cdi_annotation_prefix;
  auto memory_limits = deviceplugin::LoadMemoryLimitSettings(cfg, setup.plan);
  if (!memory_limits.ok()) return memory_limits.status();
  o.memory_limits = std::move(memory_limits).value();
  if (cfg.sharing.memory) o.memory_placement = cfg.sharing.memory->placement;
  return setup;
}

bool HasMemoryPool(const sharing::Plan& plan) {
  for (const sharing::Resource& r : plan.resources) {
    if (r.sharing == sharing::SharingKind::kMemory) return true;
  }
  return false;
}

// The memory pool's publisher (memory_publisher.h), when the API server can be reached; null
// otherwise (logged when the plan has a pool: the extender will not see this node's memory).
struct MemoryPublication {
  std::unique_ptr<k8s::Client> client;
  std::shared_ptr<deviceplugin::MemoryPoolPublisher> publisher;
};
MemoryPublication StartMemoryPublication(const PluginArgs& args, const sharing::Plan& plan,
                                         Clock& clock, const gpu::HealthBoard& board,
                                         std::shared_ptr<metrics::MemoryPoolGauges> gauges,
                                         deviceplugin::AbsenceOptions absence,
                                         std::chrono::milliseconds list_interval) {
  MemoryPublication out;
  Result<k8s::ClusterAccess> access = k8s::ResolveClusterAccess(args.kubeconfig);
  if (!access.ok()) {
    if (HasMemoryPool(plan)) {
      spdlog::warn("event=memory_pool_unpublished error=\"{}\"", access.status().message());
    }
    return out;
  }
  deviceplugin::MemoryPublisherOptions o;
  o.node_name = args.node_name;
  if (o.node_name.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) == 0) o.node_name = host;
  }
  o.namespace_name = args.memory_namespace;
  o.absence = absence;
  o.list_interval = list_interval;
  if (gauges) {
    o.on_publish = [gauges](const nlohmann::json& doc) {
      gauges->Set(metrics::MemoryPoolFromDocument(doc));
    };
  }
  const char* socket_env = std::getenv("GPULET_POD_RESOURCES_SOCKET");
  const std::string socket =
      socket_env != nullptr && *socket_env != '\0' ? socket_env : deviceplugin::kPodResourcesSocket;
  out.client = std::make_unique<k8s::Client>(*access);
  out.publisher = std::make_shared<deviceplugin::MemoryPoolPublisher>(
      o, *out.client, clock,
      [socket] { return deviceplugin::ListPodDevices(socket, std::chrono::seconds(5)); }, &board);
  spdlog::info("event=memory_pool_publisher node={} namespace={}", o.node_name, o.namespace_name);
  return out;
}

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

int RunPlugin(const GlobalOptions& global, const PluginArgs& args,
              const CompanionAgent* companion) {
  const StopSignals signals = StopSignals::Block();
  LimitMallocArenas();
  Result<config::Flags> cli = CliFlags(args);
  if (!cli.ok()) return ReportError(cli.status());
  Result<config::Config> cfg = EffectiveConfig(args, *cli);
  if (!cfg.ok()) return ReportError(cfg.status());
  const bool fail_on_init_error = cfg->flags.fail_on_init_error.value_or(true);
  Result<std::chrono::milliseconds> quiet =
      ParseDuration("--health-quiet-period", args.health_quiet_period);
  if (!quiet.ok()) return ReportError(quiet.status());
  Result<gpu::HealthPolicy> policy =
      gpu::ParseHealthPolicy(Env("DP_DISABLE_HEALTHCHECKS"), Env("DP_ENABLE_HEALTHCHECKS"));
  if (!policy.ok()) return ReportError(policy.status());
  policy->quiet_period = *quiet;

  // --shared-devices-allocation-policy (upstream's; --replica-allocation-policy is an alias) or
  // SHARED_DEVICES_ALLOCATION_POLICY > REPLICA_ALLOCATION_POLICY > the file > distributed.
  std::string policy_name = args.replica_allocation_policy;
  if (policy_name.empty()) policy_name = Env("REPLICA_ALLOCATION_POLICY");
  if (policy_name.empty()) {
    policy_name = cfg->flags.plugin.shared_devices_allocation_policy.value_or("distributed");
  }
  Result<deviceplugin::ReplicaPolicy> policy_or = deviceplugin::ParseReplicaPolicy(policy_name);
  if (!policy_or.ok()) {
    return ReportError(Status(
        ErrorCode::kUsage, "--shared-devices-allocation-policy: " + policy_or.status().message()));
  }
  const deviceplugin::ReplicaPolicy replica_policy = *policy_or;
  Result<std::chrono::milliseconds> rescan_interval =
      ParseDuration("--rescan-interval", args.rescan_interval);
  if (!rescan_interval.ok()) return ReportError(rescan_interval.status());
  Result<std::chrono::milliseconds> release_after =
      ParseDuration("--release-after", args.release_after);
  if (!release_after.ok()) return ReportError(release_after.status());
  Result<std::chrono::milliseconds> list_interval =
      ParseDuration("--pod-resources-interval", args.pod_resources_interval);
  if (!list_interval.ok()) return ReportError(list_interval.status());
  if (list_interval->count() <= 0) {
    return ReportError(Status(ErrorCode::kUsage, "--pod-resources-interval: must be above 0"));
  }
  deviceplugin::AbsenceOptions absence;
  absence.span = std::chrono::duration_cast<std::chrono::seconds>(*release_after);

  // Discovery. With failOnInitError=false a node without a working driver stays up, serving
  // nothing, as NVIDIA's plugin does (so a DaemonSet on mixed nodes does not crash-loop).
  auto wait_for_stop = [&signals] {
    RunUntilStopped(signals, std::chrono::seconds(1), {}, {});
    return 0;
  };
  Result<NodeContext> node = OpenNode(global);
  Status init_error = node.status();
  std::shared_ptr<gpu::Inventory> inventory;
  if (node.ok()) {
    Result<gpu::Inventory> inv = gpu::Discover(*node->nvml, node->discover);
    if (inv.ok()) {
      inventory = std::make_shared<gpu::Inventory>(std::move(inv).value());
    } else {
      init_error = inv.status();
    }
  }
  if (!inventory) {
    if (fail_on_init_error) return ReportError(init_error);
    spdlog::error("event=init_failed action=serve_nothing fail_on_init_error=false error=\"{}\"",
                  init_error.message());
    return wait_for_stop();
  }

  Result<deviceplugin::ServingSetup> setup = BuildSetup(*inventory, *cfg, replica_policy);
  if (!setup.ok()) return ReportError(setup.status());
  WriteNodeLabels(args.labels_file, *inventory, setup->plan, *cfg);

  Clock& clock = RealClock();
  gpu::HealthBoard board;
  gpu::HealthMonitorOptions health_options;
  health_options.policy = *policy;
  const NodeContext& opened = *node;
  // Re-discovery defers while `gpulet mig apply` holds the MIG layout lock.
  node::InventoryWatch watch(
      inventory, [&opened] { return gpu::Discover(*opened.nvml, opened.discover); },
      mig::LayoutLockPath(opened.sim_state_dir));
  node::HealthWatch health(node->nvml, health_options, clock, board);
  Status hs = health.Start(inventory);
  if (!hs.ok()) return ReportError(hs);
  node::MpsControl mps_control(args.mps_control_binary, node->nvml, board);
  // Every exit (errors included) hands the daemons over or quits them, as --mps-on-exit says.
  auto release_mps = [&mps_control, &args] {
    if (args.mps_on_exit == "quit") {
      mps_control.Stop();
    } else {
      mps_control.Detach();
    }
  };
  Status ms = mps_control.Apply(setup->plan, *inventory, MpsRoot(*cfg));
  if (!ms.ok()) {
    health.Stop();
    return ReportError(ms);
  }
  if (companion != nullptr) {
    Status cs = companion->start(*node, *inventory);
    if (!cs.ok()) {
      release_mps();
      health.Stop();
      return ReportError(cs);
    }
  }

  deviceplugin::ManagerOptions mo;
  mo.plugin_dir = args.plugin_dir;
  // Upstream's KUBELET_SOCKET (flags.plugin.kubeletSocket) is a full path; gpulet's was a name in
  // the plugin directory. Both work; inside the plugin directory the name is what is watched.
  mo.kubelet_socket_name = args.kubelet_socket.empty()
                               ? cfg->flags.plugin.kubelet_socket.value_or("kubelet.sock")
                               : args.kubelet_socket;
  if (const std::filesystem::path k(mo.kubelet_socket_name);
      k.is_absolute() && (k.parent_path() / "") == (std::filesystem::path(mo.plugin_dir) / "")) {
    mo.kubelet_socket_name = k.filename().string();
  }
  mo.config_path = args.config_file;
  const config::Flags cli_flags = *cli;
  uint64_t applied_generation = 0;
  MemoryPublication memory = StartMemoryPublication(
      args, setup->plan, clock, board, companion != nullptr ? companion->memory_pool : nullptr,
      absence, *list_interval);
  // Runs on the manager's thread (reloads) only.
  auto loader = [&]() -> Result<deviceplugin::ServingSetup> {
    uint64_t generation = 0;
    std::shared_ptr<const gpu::Inventory> inv = watch.Current(&generation);
    const bool devices_changed = generation != applied_generation;
    if (devices_changed && companion != nullptr && companion->inventory_changed) {
      companion->inventory_changed(*inv);
    }
    Result<config::Config> c = EffectiveConfig(args, cli_flags);
    Result<deviceplugin::ServingSetup> next = c.ok()
                                                  ? BuildSetup(*inv, *c, replica_policy)
                                                  : Result<deviceplugin::ServingSetup>(c.status());
    if (!next.ok()) {
      if (!devices_changed) return next.status();
      // The devices changed under the current plan: advertising it would offer devices that
      // may be gone, so serve nothing until a plan can be built.
      spdlog::error("event=plan_failed action=serve_nothing error=\"{}\"", next.status().message());
      deviceplugin::ServingSetup empty;
      empty.inventory = inv;
      applied_generation = generation;
      mps_control.Stop();
      return empty;
    }
    next->inventory = inv;
    applied_generation = generation;
    if (memory.publisher) {
      memory.publisher->SetPool(next->plan, inv);
      next->allocate.allocation_listener = memory.publisher;
    }
    WriteNodeLabels(args.labels_file, *inv, next->plan, *c);
    Status m = mps_control.Apply(next->plan, *inv, MpsRoot(*c));
    if (!m.ok()) spdlog::error("event=mps_start_failed error=\"{}\"", m.message());
    return next;
  };
  deviceplugin::Manager manager(mo, inventory, board, loader);
  if (memory.publisher) {
    memory.publisher->SetPool(setup->plan, inventory);
    setup->allocate.allocation_listener = memory.publisher;
    memory.publisher->Start();
  }
  spdlog::info(
      "event=plugin_starting gpus={} resources={} dir={} quiet_period_ms={} rescan_interval_ms={} "
      "replica_policy={}",
      inventory->gpus.size(), setup->plan.resources.size(), args.plugin_dir, quiet->count(),
      rescan_interval->count(), deviceplugin::ReplicaPolicyName(replica_policy));
  // Removes per-container memory-limit directories the kubelet no longer lists.
  deviceplugin::JanitorOptions janitor_options;
  janitor_options.absence = absence;
  // Every 30 s by default; oftener when the publisher's interval is set below 5 s (tests).
  janitor_options.interval = std::max(
      std::chrono::seconds(1),
      std::min(std::chrono::seconds(30),
               std::chrono::duration_cast<std::chrono::seconds>(6 * *list_interval)));
  deviceplugin::MemoryLimitJanitor janitor(
      deviceplugin::StateDirsOf(setup->allocate.memory_limits), "", janitor_options);
  janitor.Start();
  Status run;
  {
    // A rescan that found other devices re-plans (the loader reads watch.Current()); a kick
    // (SIGHUP) reloads the config too. Health follows the new devices, keyed by UUID.
    node::Rescanner rescanner(
        clock, {*rescan_interval, std::chrono::milliseconds(250)},
        [&watch] { return watch.Rescan(); },
        [&](node::RescanOutcome outcome, bool kicked) {
          if (outcome == node::RescanOutcome::kChanged) health.Follow(watch.Current());
          if (outcome == node::RescanOutcome::kChanged || kicked) manager.RequestReload();
        });
    SignalThread st(
        signals,
        [&rescanner, companion] {
          rescanner.Kick();
          if (companion != nullptr) companion->reload();
        },
        [&manager] { manager.Stop(); });
    run = manager.Run(std::move(setup).value());
  }
  if (memory.publisher) memory.publisher->Stop();
  if (companion != nullptr) companion->stop();
  release_mps();
  health.Stop();
  if (!run.ok()) return ReportError(run);
  spdlog::info("event=plugin_stopped");
  return 0;
}

std::function<void()> AddPluginOptions(CLI::App* cmd, PluginArgs* args) {
  cmd->add_option("--device-plugin-path", args->plugin_dir, "Kubelet device plugin directory")
      ->envname("DEVICE_PLUGIN_PATH")
      ->capture_default_str();
  cmd->add_option("--config-file,--config", args->config_file,
                  "Config file in NVIDIA's device plugin v1 format (reloaded when it changes)")
      ->envname("CONFIG_FILE");
  CLI::Option* fail_opt =
      cmd->add_option(
             "--fail-on-init-error", args->fail_on_init_error,
             "Exit non-zero when the driver or discovery fails (default true); false: stay up "
             "and serve nothing")
          ->expected(0, 1)
          ->envname("FAIL_ON_INIT_ERROR");
  cmd->add_option("--device-id-strategy", args->device_id_strategy,
                  "uuid|index: how containers are told their GPUs (default uuid)")
      ->envname("DEVICE_ID_STRATEGY");
  cmd->add_option("--device-list-strategy", args->device_list_strategy,
                  "envvar|volume-mounts|cdi-annotations|cdi-cri, or a comma list (default envvar)")
      ->envname("DEVICE_LIST_STRATEGY");
  CLI::Option* specs_opt =
      cmd->add_option("--pass-device-specs", args->pass_device_specs,
                      "Also return DeviceSpecs for /dev/nvidia* (default false)")
          ->expected(0, 1)
          ->envname("PASS_DEVICE_SPECS");
  cmd->add_option("--nvidia-driver-root,--driver-root", args->nvidia_driver_root,
                  "Root of the driver installation on the host (default /)")
      ->envname("NVIDIA_DRIVER_ROOT");
  cmd->add_option("--nvidia-dev-root,--dev-root", args->nvidia_dev_root,
                  "Host root of the /dev/nvidia* nodes (default: the driver root)")
      ->envname("NVIDIA_DEV_ROOT");
  cmd->add_option("--mig-strategy", args->mig_strategy, "none|single|mixed (default none)")
      ->envname("MIG_STRATEGY");
  cmd->add_option("--cdi-annotation-prefix", args->cdi_annotation_prefix,
                  "Prefix of CDI annotation keys (default cdi.k8s.io/)")
      ->envname("CDI_ANNOTATION_PREFIX");
  cmd->add_option("--health-quiet-period", args->health_quiet_period,
                  "An unhealthy GPU is advertised Healthy again after this long without critical "
                  "events and with a successful probe; 0 disables recovery")
      ->envname("GPULET_HEALTH_QUIET_PERIOD")
      ->capture_default_str();
  CLI::Option* policy_opt =
      cmd->add_option("--shared-devices-allocation-policy,--replica-allocation-policy",
                      args->replica_allocation_policy,
                      "distributed|packed: how GetPreferredAllocation picks replicas of shared "
                      "resources (spread over GPUs, or fill one GPU first); default: "
                      "REPLICA_ALLOCATION_POLICY, flags.plugin.sharedDevicesAllocationPolicy, "
                      "else distributed")
          ->envname("SHARED_DEVICES_ALLOCATION_POLICY");
  cmd->add_option("--mps-root", args->mps_root,
                  "Root of the MPS daemons' pipe, log and shm directories (default: "
                  "flags.plugin.mpsRoot, else /run/nvidia/mps)")
      ->envname("MPS_ROOT");
  cmd->add_option("--mps-control-binary", args->mps_control_binary,
                  "The MPS control program (a path, or a name looked up in PATH)")
      ->envname("MPS_CONTROL_BINARY")
      ->capture_default_str();
  cmd->add_option("--mps-on-exit", args->mps_on_exit,
                  "What happens to the MPS daemons when gpulet exits: keep (left running for the "
                  "next gpulet to adopt, so pods keep their MPS servers across a restart or "
                  "upgrade) or quit (stopped, compute modes restored)")
      ->envname("GPULET_MPS_ON_EXIT")
      ->check(CLI::IsMember({"keep", "quit"}))
      ->capture_default_str();
  cmd->add_option("--labels-file", args->labels_file,
                  "Write GPU Feature Discovery's node labels to this NFD feature file whenever the "
                  "plan changes (e.g. /etc/kubernetes/node-feature-discovery/features.d/gpulet)")
      ->envname("GPULET_LABELS_FILE");
  cmd->add_option("--rescan-interval", args->rescan_interval,
                  "Re-discover GPUs and MIG devices this often (and on SIGHUP); resources whose "
                  "devices changed are re-planned and restarted. 0 disables the timer")
      ->envname("GPULET_RESCAN_INTERVAL")
      ->capture_default_str();
  CLI::Option* kubelet_opt =
      cmd->add_option("--kubelet-socket", args->kubelet_socket,
                      "The kubelet's registration socket: a full path, or a name in the plugin "
                      "directory (default: flags.plugin.kubeletSocket, else kubelet.sock)")
          ->envname("KUBELET_SOCKET");
  cmd->add_option("--node-name", args->node_name,
                  "This node's Kubernetes name: names the memory pool's ConfigMap "
                  "gpulet-memory-<node> (default: the host name)")
      ->envname("NODE_NAME");
  // `gpulet node` shares the exporter's --kubeconfig (added first; see cmd_node.cc).
  if (cmd->get_option_no_throw("--kubeconfig") == nullptr) {
    cmd->add_option("--kubeconfig", args->kubeconfig,
                    "Kubeconfig for publishing the memory pool (default: in-cluster)");
  }
  cmd->add_option("--release-after", args->release_after,
                  "How long a device must be missing from the kubelet's pod-resources Lists (3 "
                  "in a row at least) before its memory units are published free and its "
                  "memory-limit directory removed; one List right after a kubelet restart can be "
                  "empty")
      ->envname("GPULET_RELEASE_AFTER")
      ->capture_default_str();
  cmd->add_option("--pod-resources-interval", args->pod_resources_interval,
                  "How often the memory pool's publisher asks the kubelet's pod-resources API")
      ->envname("GPULET_POD_RESOURCES_INTERVAL")
      ->capture_default_str();
  cmd->add_option("--memory-pool-namespace", args->memory_namespace,
                  "Namespace of the memory pool's ConfigMap (gpulet's own)")
      ->envname("POD_NAMESPACE")
      ->capture_default_str();
  return [args, fail_opt, specs_opt, policy_opt, kubelet_opt] {
    // Not given: RunPlugin takes them from the environment's aliases and the config file.
    if (policy_opt->count() == 0) args->replica_allocation_policy.clear();
    if (kubelet_opt->count() == 0) args->kubelet_socket.clear();
    // A bare boolean flag means true.
    if (fail_opt->count() > 0 && args->fail_on_init_error.empty()) {
      args->fail_on_init_error = "true";
    }
    if (specs_opt->count() > 0 && args->pass_device_specs.empty()) args->pass_device_specs = "true";
  };
}

void RegisterPlugin(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "plugin", "Serve the kubelet device plugin API (nvidia.com/gpu) for this node's GPUs");
  auto args = std::make_shared<PluginArgs>();
  std::function<void()> finish = AddPluginOptions(cmd, args.get());
  (void)exit_code;  // the agent's result is main's (GlobalOptions::agent)
  cmd->callback([&global, args, finish] {
    finish();
    global.agent = [&global, args] { return RunPlugin(global, *args); };
  });
}

}  // namespace gpulet::cli
