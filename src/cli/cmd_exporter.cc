// gpulet exporter: DCGM-compatible Prometheus metrics straight from NVML (a drop-in for NVIDIA's
// dcgm-exporter: same metric names, labels, port, counters file, flags and environment variables).
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <ctime>
#include <memory>
#include <unistd.h>

#include "cli/agents.h"
#include "cli/commands.h"
#include "common/clock.h"
#include "common/signals.h"
#include "k8s/access.h"
#include "k8s/client.h"
#include "metrics/exporter.h"
#include "metrics/pod_uids.h"
#include "mig/layout_lock.h"
#include "node/inventory_watch.h"
#include "node/rescanner.h"

namespace gpulet::cli {
namespace {

// Serves until SIGINT/SIGTERM; SIGHUP or a change of the counters file reloads it. Re-discovers
// the node every --rescan-interval (and on SIGHUP), as the plugin does: after a MIG re-layout the
// exporter is replaced, so its series follow the new devices.
int Serve(const GlobalOptions& global, const ExporterFlags& f) {
  LimitMallocArenas();
  // Block the signals before any thread starts, so they all reach the waiter below.
  const StopSignals signals = StopSignals::Block();
  Result<std::chrono::milliseconds> rescan_interval =
      ParseDuration("--rescan-interval", f.rescan_interval);
  if (!rescan_interval.ok()) return ReportError(rescan_interval.status());

  Result<NodeContext> node = OpenNode(global);
  if (!node.ok()) return ReportError(node.status());
  Result<gpu::Inventory> inventory = gpu::Discover(*node->nvml, node->discover);
  if (!inventory.ok()) return ReportError(inventory.status());

  ExporterHost host(node->nvml, f, "standalone_exporter");
  if (Status s = host.Start(*inventory); !s.ok()) return ReportError(s);
  const NodeContext& opened = *node;
  node::InventoryWatch watch(
      std::make_shared<const gpu::Inventory>(std::move(inventory).value()),
      [&opened] { return gpu::Discover(*opened.nvml, opened.discover); },
      mig::LayoutLockPath(opened.sim_state_dir));
  {
    node::Rescanner rescanner(
        RealClock(), {*rescan_interval, std::chrono::milliseconds(250)},
        [&watch] { return watch.Rescan(); },
        [&](node::RescanOutcome outcome, bool) {
          if (outcome == node::RescanOutcome::kChanged) host.Replace(*watch.Current());
        });
    RunUntilStopped(
        signals, std::chrono::seconds(1),
        [&] {
          rescanner.Kick();
          host.ReloadCounters();
        },
        [&] { host.ReloadCounters(/*only_if_changed=*/true); });
  }
  spdlog::info("event=exporter_stopping");
  host.Stop();
  return 0;
}

}  // namespace

namespace {

// dcgm-exporter flags gpulet accepts but does not act on: one warning each, when set.
void WarnIgnoredExporterFlags(const ExporterFlags& f) {
  auto warn = [](const char* flag, const std::string& why) {
    spdlog::warn("event=flag_ignored flag={} detail=\"{}\"", flag, why);
  };
  if (f.kubernetes_gpu_id_type != "uid" && f.kubernetes_gpu_id_type != "device-name") {
    warn("--kubernetes-gpu-id-type", "unknown value \"" + f.kubernetes_gpu_id_type +
                                         "\"; gpulet maps both UUIDs and device names");
  }
  if (f.kubernetes_enable_pod_labels) {
    warn("--kubernetes-enable-pod-labels",
         "pod labels need the API server; gpulet labels series with pod, namespace and container");
  }
  if ((f.kubernetes_virtual_gpus || f.kubernetes_enable_pod_uid) && !f.kubernetes) {
    warn(f.kubernetes_virtual_gpus ? "--kubernetes-virtual-gpus" : "--kubernetes-enable-pod-uid",
         "needs -k/--kubernetes (pod attribution is off)");
  }
  if (f.devices != "f") {
    warn("--devices", "gpulet publishes every GPU and MIG device (as -d f)");
  }
  if (f.use_old_namespace) {
    warn("--use-old-namespace", "gpulet publishes the DCGM_FI_* names only");
  }
}

}  // namespace

Result<std::unique_ptr<metrics::Exporter>> StartExporter(std::shared_ptr<gpu::Nvml> nvml,
                                                         gpu::Inventory inventory,
                                                         const ExporterFlags& f) {
  WarnIgnoredExporterFlags(f);
  metrics::ExporterOptions opts;
  opts.collectors_file = f.collectors;
  opts.collect_interval = std::chrono::milliseconds(f.interval_ms);
  opts.http.address = f.address;
  opts.http.web_config_file = f.web_config_file;
  // The exporter serves no POST routes: its threads are the password (bcrypt) checkers.
  opts.http.password_check_threads = f.http_threads;
  opts.kubernetes = f.kubernetes;
  opts.pod_resources.socket = f.pod_resources_socket;
  // gpulet's earlier variable, read when upstream's DCGM_POD_RESOURCES_KUBELET_SOCKET is not set.
  if (const char* old = std::getenv("DCGM_POD_RESOURCES_SOCKET");
      old != nullptr && *old != '\0' &&
      std::getenv("DCGM_POD_RESOURCES_KUBELET_SOCKET") == nullptr &&
      f.pod_resources_socket == metrics::kDefaultPodResourcesSocket) {
    opts.pod_resources.socket = old;
  }
  opts.pod_resources.refresh = std::chrono::milliseconds(f.pod_refresh_ms);
  for (const std::string& name : f.nvidia_resource_names) {
    opts.pod_resources.index_resource_prefixes.push_back(name);
  }
  // dcgm-exporter: one series per device; per-pod series on shared GPUs with
  // --kubernetes-virtual-gpus.
  opts.series_per_pod = f.kubernetes_virtual_gpus && !f.one_series_per_gpu;
  // Per-pod GPU_UTIL / FB_USED from the GPUs' processes, as dcgm-exporter 4.6+.
  opts.process_metrics = f.kubernetes && opts.series_per_pod;
  opts.proc_root = f.proc_root;
  opts.pod_uid_label = f.kubernetes_enable_pod_uid;
  if (f.kubernetes && (opts.process_metrics || f.kubernetes_enable_pod_uid)) {
    // A process's cgroup names its pod by UID, which the kubelet's pod-resources API does not
    // give: ask the API server for this node's pods, as dcgm-exporter's pod informer does.
    Result<k8s::ClusterAccess> access = k8s::ResolveClusterAccess(f.kubeconfig);
    if (access.ok()) {
      std::string node_name;
      if (const char* n = std::getenv("NODE_NAME"); n != nullptr && *n != '\0') node_name = n;
      if (node_name.empty()) node_name = f.hostname;
      if (node_name.empty()) {
        char buf[256] = {};
        if (::gethostname(buf, sizeof buf - 1) == 0) node_name = buf;
      }
      auto client = std::make_shared<k8s::Client>(std::move(access).value());
      opts.pod_resources.list_pod_uids = [client, node_name] {
        return metrics::ListPodUids(*client, node_name);
      };
    } else {
      spdlog::warn("event=pod_uids_unavailable error=\"{}\" effect=\"no pod UIDs: per-pod "
                   "DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED and pod_uid are left out\"",
                   access.status().message());
    }
  }
  opts.hostname = f.hostname;
  // dcgm-exporter takes the Hostname label from NODE_NAME when it is set.
  if (const char* node = std::getenv("NODE_NAME"); opts.hostname.empty() && node != nullptr) {
    opts.hostname = node;
  }
  opts.no_hostname = f.no_hostname;
  opts.xid_count_window = std::chrono::milliseconds(f.xid_count_window_ms);
  opts.slurm_node = f.slurm_node;
  opts.scontrol = f.scontrol;
  opts.slurm_refresh = std::chrono::milliseconds(f.slurm_refresh_ms);
  opts.memory_limits_state_dir = f.memory_limits_state_dir;
  opts.memory_pool = f.memory_pool;
  auto exporter = metrics::Exporter::Create(std::move(nvml), std::move(inventory), opts);
  if (!exporter.ok()) return exporter.status();
  if (Status s = (*exporter)->Start(); !s.ok()) return s;
  return exporter;
}

void AddExporterOptions(CLI::App* cmd, ExporterFlags* f) {
  cmd->add_option("-f,--collectors", f->collectors,
                  "Counters file in dcgm-exporter's CSV format (field, type, help); default: "
                  "built-in set")
      ->envname("DCGM_EXPORTER_COLLECTORS");
  cmd->add_option("-a,--address", f->address, "Listen address, [host]:port")
      ->envname("DCGM_EXPORTER_LISTEN")
      ->capture_default_str();
  cmd->add_option("-c,--collect-interval", f->interval_ms,
                  "Interval between NVML collections, in milliseconds")
      ->envname("DCGM_EXPORTER_INTERVAL")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->capture_default_str();
  cmd->add_flag("-k,--kubernetes", f->kubernetes,
                "Label series with the pod, namespace and container holding each GPU")
      ->envname("DCGM_EXPORTER_KUBERNETES");
  cmd->add_option("--pod-resources-kubelet-socket,--pod-resources-socket", f->pod_resources_socket,
                  "Kubelet pod-resources socket (DCGM_POD_RESOURCES_SOCKET is read too)")
      ->envname("DCGM_POD_RESOURCES_KUBELET_SOCKET")
      ->capture_default_str();
  cmd->add_option("--pod-refresh-interval", f->pod_refresh_ms,
                  "How often to re-read pod-resources, in milliseconds")
      ->envname("GPULET_EXPORTER_POD_REFRESH_INTERVAL")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->capture_default_str();
  cmd->add_flag("--kubernetes-virtual-gpus", f->kubernetes_virtual_gpus,
                "On a GPU shared by several pods (time-slicing, MPS), one series per pod and "
                "replica instead of one series per GPU; DCGM_FI_DEV_GPU_UTIL and "
                "DCGM_FI_DEV_FB_USED per pod from its processes (needs hostPID and `list` on "
                "pods)")
      ->envname("DCGM_EXPORTER_KUBERNETES_VIRTUAL_GPUS");
  cmd->add_option("--proc-root", f->proc_root,
                  "Where processes' cgroup files are read (<root>/<pid>/cgroup) for per-pod "
                  "process metrics")
      ->envname("GPULET_EXPORTER_PROC_ROOT")
      ->capture_default_str();
  cmd->add_option("--kubeconfig", f->kubeconfig,
                  "Kubeconfig for the pod UIDs of --kubernetes-virtual-gpus and "
                  "--kubernetes-enable-pod-uid (default: in-cluster)");
  cmd->add_flag("--one-series-per-gpu", f->one_series_per_gpu,
                "One series per GPU, the sharing pods' labels joined by ',' (the default; wins "
                "over --kubernetes-virtual-gpus)")
      ->envname("GPULET_EXPORTER_ONE_SERIES_PER_GPU");
  cmd->add_flag("-n,--no-hostname", f->no_hostname, "Omit the Hostname label")
      ->envname("DCGM_EXPORTER_NO_HOSTNAME");
  cmd->add_option("--kubernetes-gpu-id-type", f->kubernetes_gpu_id_type,
                  "uid|device-name: accepted for dcgm-exporter; gpulet maps both")
      ->envname("DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE")
      ->capture_default_str();
  cmd->add_flag("--kubernetes-enable-pod-labels", f->kubernetes_enable_pod_labels,
                "Accepted for dcgm-exporter; ignored with a warning")
      ->envname("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS");
  cmd->add_flag("--kubernetes-enable-pod-uid", f->kubernetes_enable_pod_uid,
                "Add the pod_uid label to pod-labelled series (pod UIDs from the API server: "
                "`list` on pods)")
      ->envname("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID");
  cmd->add_option("--nvidia-resource-names", f->nvidia_resource_names,
                  "More resource names (or prefixes) whose devices are NVIDIA GPUs, for pod "
                  "attribution (nvidia.com/ always is)")
      ->envname("DCGM_EXPORTER_NVIDIA_RESOURCE_NAMES")
      ->delimiter(',');
  cmd->add_option("-d,--devices", f->devices,
                  "dcgm-exporter's device selection; gpulet publishes every device (f)")
      ->envname("DCGM_EXPORTER_DEVICES_STR")
      ->capture_default_str();
  cmd->add_option("-x,--xid-count-window-size", f->xid_count_window_ms,
                  "Window of DCGM_EXP_XID_ERRORS_COUNT (XIDs per code, label xid), in "
                  "milliseconds")
      ->envname("DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE")
      ->check(CLI::Range(int64_t{1000}, int64_t{7} * 24 * 3600 * 1000))
      ->capture_default_str();
  cmd->add_flag("-o,--use-old-namespace", f->use_old_namespace,
                "Accepted for dcgm-exporter; ignored with a warning")
      ->envname("DCGM_EXPORTER_USE_OLD_NAMESPACE");
  cmd->add_option("--web-config-file", f->web_config_file,
                  "Prometheus web config file (TLS and basic auth)")
      ->envname("DCGM_EXPORTER_WEB_CONFIG_FILE");
  cmd->add_option("--http-threads", f->http_threads,
                  "Password-check (bcrypt) workers for basic auth; serving is one event thread")
      ->envname("GPULET_EXPORTER_HTTP_THREADS")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--hostname", f->hostname, "Value of the Hostname label (default: the host name)")
      ->envname("GPULET_EXPORTER_HOSTNAME");
  cmd->add_option("--slurm-node", f->slurm_node,
                  "Slurm node name of this host: label series with the Slurm job(s) holding each "
                  "GPU (hpc_job), from scontrol")
      ->envname("GPULET_SLURM_NODE");
  cmd->add_option("--scontrol", f->scontrol, "scontrol binary for --slurm-node")
      ->envname("GPULET_SCONTROL")
      ->capture_default_str();
  cmd->add_option("--memory-limits-state-dir", f->memory_limits_state_dir,
                  "The device plugin's gpulet.memoryLimits stateDir: export each container's GPU "
                  "memory used and limit (docs/memory-limits.md)")
      ->envname("GPULET_MEMORY_LIMITS_STATE_DIR");
  cmd->add_option("--slurm-refresh-interval", f->slurm_refresh_ms,
                  "How often to re-read Slurm jobs, in milliseconds")
      ->envname("GPULET_SLURM_REFRESH_INTERVAL")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->capture_default_str();
}

void RegisterExporter(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("exporter",
                                     "Serve DCGM-compatible GPU metrics for Prometheus (drop-in "
                                     "for dcgm-exporter, no DCGM needed)");
  auto f = std::make_shared<ExporterFlags>();
  AddExporterOptions(cmd, f.get());
  cmd->add_option("--rescan-interval", f->rescan_interval,
                  "Re-discover GPUs and MIG devices this often (and on SIGHUP); after a MIG "
                  "re-layout the series follow the new devices. 0 disables the timer")
      ->envname("GPULET_RESCAN_INTERVAL")
      ->capture_default_str();
  (void)exit_code;  // the agent's result is main's (GlobalOptions::agent)
  cmd->callback([&global, f] {
    global.agent = [&global, f] { return Serve(global, *f); };
  });
}

}  // namespace gpulet::cli
