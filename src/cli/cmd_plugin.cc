// gpulet plugin: the kubelet device plugin. Discovers the node, builds the sharing plan from
// flags/env/config file (precedence CLI > environment > file > default), serves one socket per
// resource, registers with the kubelet, watches health, and reloads on SIGHUP or a config change.
// It re-discovers the node every --rescan-interval and on SIGHUP: when the GPUs or MIG devices
// changed (`gpulet mig apply`), it re-plans and restarts only the resources that changed. MPS
// resources get one supervised control daemon each (src/mps), restarted when they change.
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cli/agents.h"
#include "cli/commands.h"
#include "config/config.h"
#include "deviceplugin/manager.h"
#include "deviceplugin/memory_limits_janitor.h"
#include "deviceplugin/resource_server.h"
#include "gpu/health.h"
#include "mps/supervisor.h"
#include "labels/labels.h"
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
  return setup;
}

// Keeps one mps::Supervisor serving the plan's MPS resources and their health on the board.
// Not thread-safe: called from one thread at a time (start-up, then the manager's loader, then
// shutdown).
class MpsControl {
 public:
  MpsControl(std::string control_binary, std::shared_ptr<gpu::Nvml> nvml, gpu::HealthBoard& board)
      : control_binary_(std::move(control_binary)), nvml_(std::move(nvml)), board_(board) {}
  ~MpsControl() { Stop(); }

  // (Re)starts the supervisor when the MPS resources, their GPUs, replicas or the root changed.
  // On failure the resources stay advertised, Unhealthy, and the error is returned.
  Status Apply(const sharing::Plan& plan, const gpu::Inventory& inventory,
               const std::string& root) {
    std::vector<mps::DaemonSpec> specs;
    std::string key = root;
    for (const sharing::Resource& r : plan.resources) {
      if (r.sharing != sharing::SharingKind::kMps) continue;
      mps::DaemonSpec spec;
      spec.resource_name = r.name;
      spec.replicas = r.replicas;
      key += "|" + r.name + "/" + std::to_string(r.replicas);
      for (const sharing::AdvertisedDevice& d : r.devices) {
        if (!spec.gpu_uuids.empty() && spec.gpu_uuids.back() == d.uuid) continue;
        const gpu::Gpu* g = inventory.FindByUuid(d.uuid);
        spec.gpu_uuids.push_back(d.uuid);
        spec.gpu_indices.push_back(d.gpu_index);
        spec.memory_bytes.push_back(g ? g->memory_mib * 1024 * 1024 : 0);
        key += "," + d.uuid;
      }
      specs.push_back(std::move(spec));
    }
    if (key == key_ && (supervisor_ || specs.empty())) return Status::Ok();
    Stop();
    key_ = key;
    if (specs.empty()) return Status::Ok();
    mps::SupervisorOptions o;
    o.control_binary = control_binary_;
    o.root = root;
    auto sup = std::make_unique<mps::Supervisor>(o, nvml_);
    gpu::HealthBoard& board = board_;
    Status s = sup->Start(specs, [&board](const std::string& resource, bool healthy) {
      spdlog::log(healthy ? spdlog::level::info : spdlog::level::warn,
                  "event=mps_daemon_health resource={} healthy={}", resource, healthy);
      board.Update({{deviceplugin::MpsHealthKey(resource),
                     healthy ? gpu::DeviceHealth{} : gpu::DeviceHealth{false, "MPS daemon down"}}});
    });
    std::map<std::string, gpu::DeviceHealth> state;
    for (const mps::DaemonSpec& spec : specs) {
      state[deviceplugin::MpsHealthKey(spec.resource_name)] =
          s.ok() ? gpu::DeviceHealth{}
                 : gpu::DeviceHealth{false, "MPS daemon failed to start: " + s.message()};
      resources_.push_back(spec.resource_name);
    }
    board_.Update(state);
    if (!s.ok()) return s;
    supervisor_ = std::move(sup);
    spdlog::info("event=mps_started resources={} root={}", specs.size(), root);
    return Status::Ok();
  }

  void Stop() {
    if (!supervisor_) return;
    supervisor_->Stop();
    supervisor_.reset();
    spdlog::info("event=mps_stopped resources={}", resources_.size());
    resources_.clear();
  }

 private:
  const std::string control_binary_;
  std::shared_ptr<gpu::Nvml> nvml_;
  gpu::HealthBoard& board_;
  std::string key_;
  std::vector<std::string> resources_;
  std::unique_ptr<mps::Supervisor> supervisor_;
};

// The node's current inventory and the health monitor watching it. Re-discovery replaces both
// when the devices changed. Thread-safe.
class NodeWatch {
 public:
  NodeWatch(const NodeContext& node, std::shared_ptr<const gpu::Inventory> inventory,
            gpu::HealthMonitorOptions health_options, const gpu::Clock& clock,
            gpu::HealthBoard& board)
      : node_(node),
        inventory_(std::move(inventory)),
        health_options_(std::move(health_options)),
        clock_(clock),
        board_(board) {}
  ~NodeWatch() { StopMonitor(); }

  Status StartMonitor() {
    std::lock_guard<std::mutex> l(mu_);
    monitor_inventory_ = inventory_;
    monitor_ = std::make_unique<gpu::HealthMonitor>(node_.nvml, *monitor_inventory_,
                                                    health_options_, clock_, board_);
    return monitor_->Start();
  }
  void StopMonitor() {
    std::lock_guard<std::mutex> l(mu_);
    if (monitor_) monitor_->Stop();
    monitor_.reset();
  }

  std::shared_ptr<const gpu::Inventory> Current(uint64_t* generation) const {
    std::lock_guard<std::mutex> l(mu_);
    if (generation) *generation = generation_;
    return inventory_;
  }

  // Discovers the node again; true when its GPUs or MIG devices changed (then the health monitor
  // follows the new inventory).
  bool Rescan() {
    Result<gpu::Inventory> found = gpu::Discover(*node_.nvml, node_.discover);
    if (!found.ok()) {
      spdlog::warn("event=rescan_failed action=keep_current error=\"{}\"",
                   found.status().message());
      return false;
    }
    std::lock_guard<std::mutex> l(mu_);
    if (sharing::SameDevices(*inventory_, *found)) return false;
    inventory_ = std::make_shared<const gpu::Inventory>(std::move(found).value());
    ++generation_;
    spdlog::info("event=inventory_changed gpus={} mig_devices={} generation={}",
                 inventory_->gpus.size(), inventory_->MigDeviceCount(), generation_);
    if (monitor_) {
      monitor_->Stop();
      monitor_inventory_ = inventory_;
      monitor_ = std::make_unique<gpu::HealthMonitor>(node_.nvml, *monitor_inventory_,
                                                      health_options_, clock_, board_);
      Status s = monitor_->Start();
      if (!s.ok()) spdlog::error("event=health_monitor_failed error=\"{}\"", s.message());
    }
    return true;
  }

 private:
  const NodeContext& node_;
  mutable std::mutex mu_;
  std::shared_ptr<const gpu::Inventory> inventory_;
  uint64_t generation_ = 0;
  const gpu::HealthMonitorOptions health_options_;
  const gpu::Clock& clock_;
  gpu::HealthBoard& board_;
  std::shared_ptr<const gpu::Inventory> monitor_inventory_;  // what monitor_ references
  std::unique_ptr<gpu::HealthMonitor> monitor_;
};

// Re-discovers every `interval` (0: never) and whenever Kick()ed; calls on_change after a rescan
// that found different devices, and after every kick (a SIGHUP reloads the config too).
class Rescanner {
 public:
  Rescanner(NodeWatch& watch, std::chrono::milliseconds interval, std::function<void()> on_change)
      : watch_(watch),
        interval_(interval),
        on_change_(std::move(on_change)),
        thread_([this] { Loop(); }) {}
  ~Rescanner() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Kick() {
    {
      std::lock_guard<std::mutex> l(mu_);
      kicked_ = true;
    }
    cv_.notify_all();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      auto woken = [this] { return stop_ || kicked_; };
      if (interval_.count() > 0) {
        cv_.wait_for(l, interval_, woken);
      } else {
        cv_.wait(l, woken);
      }
      if (stop_) break;
      const bool kicked = kicked_;
      kicked_ = false;
      l.unlock();
      const bool changed = watch_.Rescan();
      if (changed || kicked) on_change_();
      l.lock();
    }
  }

  NodeWatch& watch_;
  const std::chrono::milliseconds interval_;
  std::function<void()> on_change_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool kicked_ = false;
  std::thread thread_;  // last: starts after the fields above are ready
};

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Blocks SIGTERM/SIGINT/SIGHUP in every thread (call before any thread starts) and returns the set.
sigset_t BlockSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// Waits for signals on its own thread until `done`: SIGHUP → on_hup, SIGTERM/SIGINT → on_stop.
class SignalThread {
 public:
  SignalThread(sigset_t set, std::function<void()> on_hup, std::function<void()> on_stop)
      : thread_([this, set, on_hup, on_stop] {
          timespec tick{0, 200'000'000};
          while (!done_) {
            int sig = sigtimedwait(&set, nullptr, &tick);
            if (sig == SIGHUP) {
              spdlog::info("event=signal signal=SIGHUP action=reload");
              on_hup();
            } else if (sig == SIGTERM || sig == SIGINT) {
              spdlog::info("event=signal signal={} action=stop",
                           sig == SIGTERM ? "SIGTERM" : "SIGINT");
              on_stop();
            }
          }
        }) {}
  ~SignalThread() {
    done_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace

int RunPlugin(const GlobalOptions& global, const PluginArgs& args,
              const CompanionAgent* companion) {
  sigset_t signals = BlockSignals();
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
    return ReportError(Status(ErrorCode::kUsage, "--shared-devices-allocation-policy: " +
                                                     policy_or.status().message()));
  }
  const deviceplugin::ReplicaPolicy replica_policy = *policy_or;
  Result<std::chrono::milliseconds> rescan_interval =
      ParseDuration("--rescan-interval", args.rescan_interval);
  if (!rescan_interval.ok()) return ReportError(rescan_interval.status());

  // Discovery. With failOnInitError=false a node without a working driver stays up, serving
  // nothing, as NVIDIA's plugin does (so a DaemonSet on mixed nodes does not crash-loop).
  auto wait_for_stop = [&signals] {
    std::atomic<bool> stop{false};
    SignalThread st(
        signals, [] {}, [&stop] { stop = true; });
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
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

  gpu::SteadyClock clock;
  gpu::HealthBoard board;
  gpu::HealthMonitorOptions health_options;
  health_options.policy = *policy;
  NodeWatch watch(*node, inventory, health_options, clock, board);
  Status hs = watch.StartMonitor();
  if (!hs.ok()) return ReportError(hs);
  MpsControl mps_control(args.mps_control_binary, node->nvml, board);
  Status ms = mps_control.Apply(setup->plan, *inventory, MpsRoot(*cfg));
  if (!ms.ok()) {
    watch.StopMonitor();
    return ReportError(ms);
  }
  if (companion != nullptr) {
    Status cs = companion->start(*node, *inventory);
    if (!cs.ok()) {
      mps_control.Stop();
      watch.StopMonitor();
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
    WriteNodeLabels(args.labels_file, *inv, next->plan, *c);
    Status m = mps_control.Apply(next->plan, *inv, MpsRoot(*c));
    if (!m.ok()) spdlog::error("event=mps_start_failed error=\"{}\"", m.message());
    return next;
  };
  deviceplugin::Manager manager(mo, inventory, board, loader);
  spdlog::info(
      "event=plugin_starting gpus={} resources={} dir={} quiet_period_ms={} rescan_interval_ms={} "
      "replica_policy={}",
      inventory->gpus.size(), setup->plan.resources.size(), args.plugin_dir, quiet->count(),
      rescan_interval->count(), deviceplugin::ReplicaPolicyName(replica_policy));
  // Removes per-container memory-limit directories the kubelet no longer lists.
  deviceplugin::MemoryLimitJanitor janitor(deviceplugin::StateDirsOf(setup->allocate.memory_limits));
  janitor.Start();
  Status run;
  {
    Rescanner rescanner(watch, *rescan_interval, [&manager] { manager.RequestReload(); });
    SignalThread st(
        signals,
        [&rescanner, companion] {
          rescanner.Kick();
          if (companion != nullptr) companion->reload();
        },
        [&manager] { manager.Stop(); });
    run = manager.Run(std::move(setup).value());
  }
  if (companion != nullptr) companion->stop();
  mps_control.Stop();
  watch.StopMonitor();
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
  cmd->callback([&global, &exit_code, args, finish] {
    finish();
    exit_code = RunPlugin(global, *args);
  });
}

}  // namespace gpulet::cli
