// gpulet plugin: the kubelet device plugin. Discovers the node once, builds the sharing plan from
// flags/env/config file (precedence CLI > environment > file > default), serves one socket per
// resource, registers with the kubelet, watches health, and reloads on SIGHUP or a config change.
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "cli/agents.h"
#include "cli/commands.h"
#include "config/config.h"
#include "deviceplugin/manager.h"
#include "gpu/health.h"
#include "sharing/plan.h"

namespace gpulet::cli {
namespace {

Result<bool> ParseBool(const std::string& name, const std::string& v) {
  if (v.empty() || v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  return Status(ErrorCode::kUsage, name + ": invalid value \"" + v + "\" (want true|false)");
}

// "60s", "500ms", "2m", "1h", "0".
Result<std::chrono::milliseconds> ParseDuration(const std::string& name, const std::string& v) {
  size_t pos = 0;
  long long n = 0;
  try {
    n = std::stoll(v, &pos);
  } catch (...) {
    pos = 0;
  }
  std::string unit = v.substr(pos);
  if (pos == 0 || n < 0 || (unit.empty() && n != 0)) {
    return Status(ErrorCode::kUsage,
                  name + ": invalid duration \"" + v + "\" (want e.g. 500ms, 30s, 5m, 0)");
  }
  if (unit.empty() || unit == "ms") return std::chrono::milliseconds(n);
  if (unit == "s") return std::chrono::milliseconds(n * 1000);
  if (unit == "m") return std::chrono::milliseconds(n * 60'000);
  if (unit == "h") return std::chrono::milliseconds(n * 3'600'000);
  return Status(ErrorCode::kUsage, name + ": invalid duration unit in \"" + v + "\"");
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
  }
  cfg.flags = config::Overlay(cfg.flags, cli);
  return cfg;
}

Result<deviceplugin::ServingSetup> BuildSetup(const gpu::Inventory& inventory,
                                              const config::Config& cfg) {
  Result<sharing::Plan> plan = sharing::BuildPlan(inventory, cfg);
  if (!plan.ok()) return plan.status();
  deviceplugin::ServingSetup setup;
  setup.plan = std::move(plan).value();
  const config::Flags& f = cfg.flags;
  deviceplugin::AllocateOptions& o = setup.allocate;
  if (f.plugin.device_list_strategy) o.device_list_strategies = *f.plugin.device_list_strategy;
  o.device_id_strategy = f.plugin.device_id_strategy.value_or(config::DeviceIdStrategy::kUuid);
  o.pass_device_specs = f.plugin.pass_device_specs.value_or(false);
  // As NVIDIA's plugin: the device root defaults to the driver root.
  o.nvidia_dev_root = f.nvidia_dev_root.value_or(f.nvidia_driver_root.value_or("/"));
  if (f.plugin.cdi_annotation_prefix) o.cdi_annotation_prefix = *f.plugin.cdi_annotation_prefix;
  return setup;
}

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

  Result<deviceplugin::ServingSetup> setup = BuildSetup(*inventory, *cfg);
  if (!setup.ok()) return ReportError(setup.status());

  gpu::SteadyClock clock;
  gpu::HealthBoard board;
  gpu::HealthMonitorOptions health_options;
  health_options.policy = *policy;
  gpu::HealthMonitor monitor(node->nvml, *inventory, health_options, clock, board);
  Status hs = monitor.Start();
  if (!hs.ok()) return ReportError(hs);
  if (companion != nullptr) {
    Status cs = companion->start(*node, *inventory);
    if (!cs.ok()) {
      monitor.Stop();
      return ReportError(cs);
    }
  }

  deviceplugin::ManagerOptions mo;
  mo.plugin_dir = args.plugin_dir;
  mo.kubelet_socket_name = args.kubelet_socket;
  mo.config_path = args.config_file;
  const config::Flags cli_flags = *cli;
  std::shared_ptr<const gpu::Inventory> inv_const = inventory;
  deviceplugin::Manager manager(mo, inventory, board, [args, cli_flags, inv_const] {
    Result<config::Config> c = EffectiveConfig(args, cli_flags);
    if (!c.ok()) return Result<deviceplugin::ServingSetup>(c.status());
    return BuildSetup(*inv_const, *c);
  });
  spdlog::info("event=plugin_starting gpus={} resources={} dir={} quiet_period_ms={}",
               inventory->gpus.size(), setup->plan.resources.size(), args.plugin_dir,
               quiet->count());
  Status run;
  {
    SignalThread st(
        signals,
        [&manager, companion] {
          manager.RequestReload();
          if (companion != nullptr) companion->reload();
        },
        [&manager] { manager.Stop(); });
    run = manager.Run(std::move(setup).value());
  }
  if (companion != nullptr) companion->stop();
  monitor.Stop();
  if (!run.ok()) return ReportError(run);
  spdlog::info("event=plugin_stopped");
  return 0;
}



std::function<void()> AddPluginOptions(CLI::App* cmd, PluginArgs* args) {
  cmd->add_option("--device-plugin-path", args->plugin_dir, "Kubelet device plugin directory")
      ->envname("DEVICE_PLUGIN_PATH")
      ->capture_default_str();
  cmd->add_option("--config", args->config_file,
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
  cmd->add_option("--nvidia-driver-root", args->nvidia_driver_root,
                  "Root of the driver installation on the host (default /)")
      ->envname("NVIDIA_DRIVER_ROOT");
  cmd->add_option("--nvidia-dev-root", args->nvidia_dev_root,
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
  cmd->add_option("--kubelet-socket", args->kubelet_socket,
                  "Name of the kubelet's registration socket in the plugin directory")
      ->envname("GPULET_KUBELET_SOCKET")
      ->capture_default_str();
  return [args, fail_opt, specs_opt] {
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
