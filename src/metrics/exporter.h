// The exporter assembled: one NVML session, an Inventory, the collector and XID threads, pod
// attribution, the HTTP server, and counters-file reloading. `gpulet exporter` and `gpulet node`
// build one of these; both share the caller's gpu::Nvml.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <sys/stat.h>

#include "common/status.h"
#include "gpu/inventory.h"
#include "gpu/nvml.h"
#include "metrics/collector.h"
#include "metrics/http_server.h"
#include "metrics/memory_pool.h"
#include "metrics/pod_resources.h"

namespace gpulet::slurm {
class JobMapper;
}

namespace gpulet::metrics {

struct ExporterOptions {
  std::string collectors_file;  // empty: built-in DefaultCounters()
  std::chrono::milliseconds collect_interval{30000};
  HttpOptions http;
  bool kubernetes = false;
  PodResourcesOptions pod_resources;
  bool series_per_pod = true;
  // --kubernetes-virtual-gpus: per-pod DCGM_FI_DEV_GPU_UTIL / DCGM_FI_DEV_FB_USED from the GPUs'
  // processes (needs series_per_pod, and pod UIDs through pod_resources.list_pod_uids). Each
  // process's pod is read from <proc_root>/<pid>/cgroup.
  bool process_metrics = false;
  std::string proc_root = "/proc";
  bool pod_uid_label = false;  // --kubernetes-enable-pod-uid
  std::string hostname;  // empty: gethostname()
  bool no_hostname = false;  // dcgm-exporter's --no-hostname: no Hostname label at all
  // dcgm-exporter's --xid-count-window-size: the window of DCGM_EXP_XID_ERRORS_COUNT.
  std::chrono::milliseconds xid_count_window{std::chrono::minutes(5)};
  // Slurm: with a node name, `scontrol show job -d -o` is polled and series get `hpc_job`.
  std::string slurm_node;
  std::string scontrol = "scontrol";
  std::chrono::milliseconds slurm_refresh{std::chrono::seconds(10)};
  // The device plugin's gpulet.memoryLimits stateDir: per container memory used / limit series
  // (metrics/memory_limits.h) at every collection. Empty: none.
  std::string memory_limits_state_dir;
  // The memory pool's per-GPU units (metrics/memory_pool.h), when the device plugin runs in this
  // process (`gpulet node`); null: none.
  std::shared_ptr<const MemoryPoolGauges> memory_pool;
};

class Exporter {
 public:
  // Loads the counters file (errors name file:line) and prepares everything; starts nothing.
  static Result<std::unique_ptr<Exporter>> Create(std::shared_ptr<const gpu::Nvml> nvml,
                                                  gpu::Inventory inventory,
                                                  ExporterOptions options);
  ~Exporter();  // Stop()s

  // First collection, then the threads, then the HTTP listener.
  Status Start();
  void Stop();

  // Re-reads the counters file; on error keeps the current one and returns the error.
  Status ReloadCounters();
  // True when the counters file's identity (inode, size, mtime) changed since the last load.
  bool CountersFileChanged() const;

  int port() const { return server_ ? server_->port() : 0; }
  const Publisher& publisher() const { return publisher_; }

 private:
  Exporter(std::shared_ptr<const gpu::Nvml> nvml, gpu::Inventory inventory, ExporterOptions options);
  struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileId&) const = default;
  };
  static FileId Identify(const std::string& path);
  Result<std::shared_ptr<const CounterSet>> Load();

  std::shared_ptr<const gpu::Nvml> nvml_;
  gpu::Inventory inventory_;
  ExporterOptions options_;
  FileId counters_id_;
  std::shared_ptr<const CounterSet> counters_;
  XidLog xids_;
  Publisher publisher_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<Collector> collector_;
  std::unique_ptr<XidWatcher> xid_watcher_;
  std::unique_ptr<PodResourcesWatcher> pods_;
  std::unique_ptr<slurm::JobMapper> jobs_;
  std::unique_ptr<MetricsServer> server_;
};

}  // namespace gpulet::metrics
