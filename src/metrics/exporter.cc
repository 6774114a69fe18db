#include "metrics/exporter.h"
#include "metrics/memory_limits.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include "slurm/jobs.h"

namespace gpulet::metrics {
namespace {

std::string LocalHostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

}  // namespace

Exporter::Exporter(std::shared_ptr<const gpu::Nvml> nvml, gpu::Inventory inventory,
                   ExporterOptions options)
    : nvml_(std::move(nvml)),
      inventory_(std::move(inventory)),
      options_(std::move(options)),
      publisher_(options_.series_per_pod, options_.pod_uid_label) {}

Exporter::~Exporter() { Stop(); }

Exporter::FileId Exporter::Identify(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {st.st_dev, st.st_ino, st.st_size,
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

Result<std::shared_ptr<const CounterSet>> Exporter::Load() {
  if (options_.collectors_file.empty()) return std::make_shared<const CounterSet>(DefaultCounters());
  counters_id_ = Identify(options_.collectors_file);
  auto set = LoadCounters(options_.collectors_file);
  if (!set.ok()) return set.status();
  for (const std::string& s : set->skipped) spdlog::warn("event=counter_skipped where=\"{}\"", s);
  return std::make_shared<const CounterSet>(std::move(set).value());
}

Result<std::unique_ptr<Exporter>> Exporter::Create(std::shared_ptr<const gpu::Nvml> nvml,
                                                   gpu::Inventory inventory,
                                                   ExporterOptions options) {
  std::unique_ptr<Exporter> e(new Exporter(std::move(nvml), std::move(inventory), std::move(options)));
  auto counters = e->Load();
  if (!counters.ok()) return counters.status();
  e->counters_ = std::move(counters).value();
  e->xids_.SetCountWindow(e->options_.xid_count_window);
  if (e->options_.no_hostname) {
    e->options_.hostname.clear();
  } else if (e->options_.hostname.empty()) {
    e->options_.hostname = LocalHostname();
  }
  e->sampler_ = std::make_unique<Sampler>(e->nvml_->fn(), e->inventory_, e->options_.hostname, &e->xids_);
  if (e->options_.process_metrics) e->sampler_->EnableProcesses(e->options_.proc_root);
  return e;
}

Status Exporter::Start() {
  collector_ = std::make_unique<Collector>(*sampler_, counters_, options_.collect_interval, publisher_);
  std::vector<nvmlDevice_t> handles;
  for (const gpu::Gpu& g : inventory_.gpus) handles.push_back(sampler_->Handle(g.index));
  xid_watcher_ = std::make_unique<XidWatcher>(nvml_->fn(), std::move(handles), xids_,
                                              [this] { collector_->Wake(); });
  if (options_.kubernetes) {
    if (!options_.pod_resources.mig_placement) {
      options_.pod_resources.mig_placement = NvmlMigPlacements(nvml_);
    }
    pods_ = std::make_unique<PodResourcesWatcher>(
        inventory_, options_.pod_resources, [this](PodMap m) { publisher_.SetPods(std::move(m)); });
  }
  if (!options_.slurm_node.empty()) {
    slurm::JobMapperOptions jo;
    jo.node_name = options_.slurm_node;
    jo.refresh = options_.slurm_refresh;
    jo.scontrol = options_.scontrol;
    jobs_ = slurm::JobMapper::ForNode(inventory_, jo);
    jobs_->Start();
  }
  if (jobs_ || !options_.memory_limits_state_dir.empty() || options_.memory_pool) {
    collector_->SetBeforePublish([this] {
      if (jobs_) publisher_.SetJobs(jobs_->JobsByGpu());
      std::string extra;
      if (!options_.memory_limits_state_dir.empty()) {
        extra = ContainerMemoryText(options_.memory_limits_state_dir,
                                    options_.pod_resources.socket);
      }
      if (options_.memory_pool) extra += options_.memory_pool->Text();
      if (!options_.memory_limits_state_dir.empty() || options_.memory_pool) {
        publisher_.SetExtra(std::move(extra));
      }
    });
  }
  // Pods first, so the first rendering already carries their labels.
  if (pods_) pods_->Start();
  collector_->Start();
  xid_watcher_->Start();
  server_ = std::make_unique<MetricsServer>(publisher_, options_.http);
  if (Status s = server_->Start(); !s.ok()) {
    Stop();
    return s;
  }
  auto r = publisher_.Current();
  spdlog::info("event=exporter_started gpus={} fields={} labels={} series={} interval_ms={} "
               "kubernetes={} counters=\"{}\"",
               inventory_.gpus.size(), counters_->metrics.size(), counters_->labels.size(),
               r ? r->series : 0, options_.collect_interval.count(), options_.kubernetes,
               counters_->source);
  return Status::Ok();
}

void Exporter::Stop() {
  if (server_) server_->Stop();
  if (xid_watcher_) xid_watcher_->Stop();
  if (pods_) pods_->Stop();
  if (collector_) collector_->Stop();
  if (jobs_) jobs_->Stop();
}

bool Exporter::CountersFileChanged() const {
  if (options_.collectors_file.empty()) return false;
  return !(Identify(options_.collectors_file) == counters_id_);
}

Status Exporter::ReloadCounters() {
  if (options_.collectors_file.empty()) return Status::Ok();
  auto counters = Load();
  if (!counters.ok()) {
    spdlog::error("event=counters_reload_failed error=\"{}\" effect=\"keeping previous counters\"",
                  counters.status().message());
    return counters.status();
  }
  counters_ = std::move(counters).value();
  if (collector_) collector_->SetCounters(counters_);
  spdlog::info("event=counters_reloaded file={} fields={} labels={}", options_.collectors_file,
               counters_->metrics.size(), counters_->labels.size());
  return Status::Ok();
}

}  // namespace gpulet::metrics
