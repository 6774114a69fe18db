// The two long-running agents, shared by `gpulet plugin`, `gpulet exporter` and `gpulet node`
// (both in one process over one NVML session).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "metrics/exporter.h"

namespace gpulet::cli {

// Raw plugin flag values as given on the command line or in the environment; empty = not given.
struct PluginArgs {
  std::string plugin_dir = "/var/lib/kubelet/device-plugins/";
  std::string config_file;
  std::string fail_on_init_error;
  std::string device_id_strategy;
  std::string device_list_strategy;
  std::string pass_device_specs;
  std::string nvidia_driver_root;
  std::string nvidia_dev_root;
  std::string mig_strategy;
  std::string cdi_annotation_prefix;
  std::string health_quiet_period = "60s";
  std::string kubelet_socket = "kubelet.sock";
  // NFD feature file for GFD's node labels, rewritten whenever the plan changes; empty: off.
  std::string labels_file;
  std::string replica_allocation_policy = "distributed";
  std::string mps_root;  // empty: flags.plugin.mpsRoot from the file, else /run/nvidia/mps
  std::string mps_control_binary = "nvidia-cuda-mps-control";
  // At exit: "keep" leaves the MPS daemons for the next gpulet to adopt (pods keep their MPS
  // servers across a restart or upgrade); "quit" stops them and restores compute modes.
  std::string mps_on_exit = "keep";
  std::string rescan_interval = "30s";
  // The memory pool's publication (sharing.memory): this node's name, the API server, and the
  // namespace of the gpulet-memory-<node> ConfigMap.
  std::string node_name;
  std::string kubeconfig;
  std::string memory_namespace = "gpulet-system";
  // A device the kubelet stops listing counts as ended (its pool units published free, its
  // memory-limit directory removed) only once it has been missing from 3 consecutive
  // pod-resources Lists spanning release_after; Lists are taken every pod_resources_interval.
  std::string release_after = "60s";
  std::string pod_resources_interval = "5s";
};

// Adds the plugin's flags to `cmd`. Call the returned function in the command's callback: it
// turns bare boolean flags into "true".
std::function<void()> AddPluginOptions(CLI::App* cmd, PluginArgs* args);

// Lets another agent share the plugin's process: started after discovery with the same NVML
// session and inventory, reloaded on SIGHUP, stopped before the plugin returns.
struct CompanionAgent {
  std::function<Status(const NodeContext& node, const gpu::Inventory& inventory)> start;
  std::function<void()> reload;
  std::function<void()> stop;
  // Optional: the rescan found other GPUs or MIG devices (called on the plugin manager's thread,
  // after start, never concurrently with itself).
  std::function<void(const gpu::Inventory& inventory)> inventory_changed;
  // Optional: receives every memory-pool document the plugin publishes (metrics/memory_pool.h).
  std::shared_ptr<metrics::MemoryPoolGauges> memory_pool;
};

// Runs the device plugin until SIGTERM/SIGINT; returns the exit code.
int RunPlugin(const GlobalOptions& global, const PluginArgs& args,
              const CompanionAgent* companion = nullptr);

// `gpulet dra`'s flag values (cmd_dra.cc), also `gpulet node --dra`'s.
struct DraArgs {
  std::string node_name;
  std::string kubeconfig;
  std::string registry_dir = "/var/lib/kubelet/plugins_registry";
  std::string plugins_dir = "/var/lib/kubelet/plugins";
  std::string cdi_root = "/var/run/cdi";
  std::string driver_root = "/";
  std::string host_driver_root;
  std::string state_dir;  // empty: the node preparer's default (on tmpfs, as the CDI specs)
  std::string plugin_state_dir;
  std::string cuda_library;
  std::string instance;
  std::string boot_id_file = "/proc/sys/kernel/random/boot_id";
  bool device_status = true;
  bool health = true;
  bool publish_slices = true;
  std::string memory_unit = "1Gi";
  std::string placement_policy = "bestfit";
  std::string mps_control_binary = "nvidia-cuda-mps-control";
  std::string mps_root = "/run/gpulet/dra-mps";
  // A device plugin serving nvidia.com/gpu or nvidia.com/mig-* here (a live nvidia-*.sock in this
  // directory) makes the driver refuse to start, unless allowed: the shipped DeviceClasses map
  // those extended resources to this driver, and one node must not serve them both ways.
  std::string device_plugin_path = "/var/lib/kubelet/device-plugins";
  bool allow_device_plugin = false;
};

// Adds the DRA driver's flags, each named --<prefix><name>: prefix "" for `gpulet dra`, "dra-"
// inside `gpulet node` (where --plugin-dir and --driver-root are the device plugin's, and
// --node-name and --kubeconfig are shared and not added again).
void AddDraOptions(CLI::App* cmd, DraArgs& args, const std::string& prefix);

// Runs the DRA kubelet plugin until SIGTERM/SIGINT; returns the exit code. `companion` (the
// exporter of `gpulet node --dra`) starts on the same NVML session and inventory once the plugin
// serves, is reloaded on SIGHUP and stopped first.
int RunDra(const GlobalOptions& global, DraArgs args, const CompanionAgent* companion = nullptr);

struct ExporterFlags {
  std::string collectors;
  std::string address = ":9400";
  int64_t interval_ms = 30000;
  bool kubernetes = false;
  std::string pod_resources_socket = std::string(metrics::kDefaultPodResourcesSocket);
  int64_t pod_refresh_ms = 10000;
  bool one_series_per_gpu = false;
  // dcgm-exporter 4.x flags (see AddExporterOptions).
  bool no_hostname = false;
  bool kubernetes_virtual_gpus = false;
  std::string kubernetes_gpu_id_type = "uid";
  bool kubernetes_enable_pod_labels = false;
  bool kubernetes_enable_pod_uid = false;
  std::vector<std::string> nvidia_resource_names;
  std::string devices = "f";
  int64_t xid_count_window_ms = 300000;
  bool use_old_namespace = false;
  std::string web_config_file;
  int http_threads = 4;
  std::string hostname;
  std::string slurm_node;
  std::string scontrol = "scontrol";
  int64_t slurm_refresh_ms = 10000;
  std::string memory_limits_state_dir;  // gpulet.memoryLimits stateDir (docs/memory-limits.md)
  // `gpulet node`: the memory pool's gauges, written by the plugin's publisher.
  std::shared_ptr<metrics::MemoryPoolGauges> memory_pool;
  // --kubernetes-virtual-gpus / --kubernetes-enable-pod-uid: where processes' cgroups are read,
  // and the API server that names pod UIDs (default: in-cluster).
  std::string proc_root = "/proc";
  std::string kubeconfig;
  // `gpulet exporter` only (`gpulet node` follows the plugin's --rescan-interval).
  std::string rescan_interval = "30s";
};

void AddExporterOptions(CLI::App* cmd, ExporterFlags* flags);

// One running exporter, replaced over the same NVML session and address when a rescan finds
// other GPUs or MIG devices (its series follow the new layout). Scrapes in the few milliseconds
// between the two get a refused connection, which Prometheus records as one failed scrape.
// `gpulet exporter` and `gpulet node` each hold one. Thread-safe.
class ExporterHost {
 public:
  // `name` prefixes the log events ("node_exporter" → event=node_exporter_restarted).
  ExporterHost(std::shared_ptr<gpu::Nvml> nvml, ExporterFlags flags, std::string name);
  ~ExporterHost();  // Stop()s
  ExporterHost(const ExporterHost&) = delete;
  ExporterHost& operator=(const ExporterHost&) = delete;

  Status Start(const gpu::Inventory& inventory);
  // Replaces the running exporter with one for `inventory` (failures are logged).
  void Replace(const gpu::Inventory& inventory);
  // Re-reads the counters file (on SIGHUP, or when `only_if_changed` and the file changed).
  void ReloadCounters(bool only_if_changed = false);
  void Stop();

 private:
  const std::shared_ptr<gpu::Nvml> nvml_;
  const ExporterFlags flags_;
  const std::string name_;
  std::mutex mu_;
  std::unique_ptr<metrics::Exporter> exporter_;
};

// Creates and starts the exporter on an open NVML session.
Result<std::unique_ptr<metrics::Exporter>> StartExporter(std::shared_ptr<gpu::Nvml> nvml,
                                                         gpu::Inventory inventory,
                                                         const ExporterFlags& flags);

// For the long-running node agents (plugin, exporter, dra, node): at most two malloc arenas.
// glibc gives each thread that allocates its own arena, up to 8 per core, and each keeps its
// touched pages; the agents' threads mostly wait, and `gpulet dra` held 1.2 MiB less with two
// (docs/benchmarks.md, "DRA kubelet plugin"). MALLOC_ARENA_MAX in the environment wins. Call it
// before the agent starts its threads.
void LimitMallocArenas();

}  // namespace gpulet::cli
