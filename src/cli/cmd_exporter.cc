// gpulet exporter: DCGM-compatible Prometheus metrics straight from NVML (a drop-in for NVIDIA's
// dcgm-exporter: same metric names, labels, port, counters file, flags and environment variables).
#include <signal.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <ctime>
#include <memory>

#include "cli/agents.h"
#include "cli/commands.h"
#include "metrics/exporter.h"

namespace gpulet::cli {
namespace {

// Serves until SIGINT/SIGTERM; SIGHUP or a change of the counters file reloads it.
int Serve(const GlobalOptions& global, const ExporterFlags& f) {
  // Block the signals before any thread starts, so they all reach sigtimedwait below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Result<NodeContext> node = OpenNode(global);
  if (!node.ok()) return ReportError(node.status());
  Result<gpu::Inventory> inventory = gpu::Discover(*node->nvml, node->discover);
  if (!inventory.ok()) return ReportError(inventory.status());

  auto exporter = StartExporter(node->nvml, std::move(inventory).value(), f);
  if (!exporter.ok()) return ReportError(exporter.status());

  for (;;) {
    timespec tick{1, 0};
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      spdlog::info("event=exporter_stopping signal={}", sig);
      break;
    }
    if (sig == SIGHUP || (sig < 0 && errno == EAGAIN && (*exporter)->CountersFileChanged())) {
      (void)(*exporter)->ReloadCounters();  // logged; the previous counters stay on error
    }
  }
  (*exporter)->Stop();
  return 0;
}

}  // namespace

Result<std::unique_ptr<metrics::Exporter>> StartExporter(std::shared_ptr<gpu::Nvml> nvml,
                                                         gpu::Inventory inventory,
                                                         const ExporterFlags& f) {
  metrics::ExporterOptions opts;
  opts.collectors_file = f.collectors;
  opts.collect_interval = std::chrono::milliseconds(f.interval_ms);
  opts.http.address = f.address;
  opts.http.web_config_file = f.web_config_file;
  opts.http.threads = f.http_threads;
  opts.kubernetes = f.kubernetes;
  opts.pod_resources.socket = f.pod_resources_socket;
  opts.pod_resources.refresh = std::chrono::milliseconds(f.pod_refresh_ms);
  opts.series_per_pod = !f.one_series_per_gpu;
  opts.hostname = f.hostname;
  opts.slurm_node = f.slurm_node;
  opts.scontrol = f.scontrol;
  opts.slurm_refresh = std::chrono::milliseconds(f.slurm_refresh_ms);
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
  cmd->add_option("--pod-resources-socket,--pod-resources-kubelet-socket", f->pod_resources_socket,
                  "Kubelet pod-resources socket")
      ->envname("DCGM_POD_RESOURCES_SOCKET")
      ->capture_default_str();
  cmd->add_option("--pod-refresh-interval", f->pod_refresh_ms,
                  "How often to re-read pod-resources, in milliseconds")
      ->envname("GPULET_EXPORTER_POD_REFRESH_INTERVAL")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->capture_default_str();
  cmd->add_flag("--one-series-per-gpu", f->one_series_per_gpu,
                "On a GPU shared by several pods, emit one series with the pods' labels joined by "
                "',' instead of one series per pod")
      ->envname("GPULET_EXPORTER_ONE_SERIES_PER_GPU");
  cmd->add_option("--web-config-file", f->web_config_file,
                  "Prometheus web config file (TLS and basic auth)")
      ->envname("DCGM_EXPORTER_WEB_CONFIG_FILE");
  cmd->add_option("--http-threads", f->http_threads, "HTTP worker threads")
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
  cmd->add_option("--slurm-refresh-interval", f->slurm_refresh_ms,
                  "How often to re-read Slurm jobs, in milliseconds")
      ->envname("GPULET_SLURM_REFRESH_INTERVAL")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->capture_default_str();
}

void RegisterExporter(CLI::App& app, GlobalOptions& global, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "exporter",
      "Serve DCGM-compatible GPU metrics for Prometheus (drop-in for dcgm-exporter, no DCGM needed)");
  auto f = std::make_shared<ExporterFlags>();
  AddExporterOptions(cmd, f.get());
  cmd->callback([&global, &exit_code, f] { exit_code = Serve(global, *f); });
}

}  // namespace gpulet::cli
