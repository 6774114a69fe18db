#include "cli/agents.h"

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

namespace gpulet::cli {

ExporterHost::ExporterHost(std::shared_ptr<gpu::Nvml> nvml, ExporterFlags flags, std::string name)
    : nvml_(std::move(nvml)), flags_(std::move(flags)), name_(std::move(name)) {}

ExporterHost::~ExporterHost() { Stop(); }

Status ExporterHost::Start(const gpu::Inventory& inventory) {
  std::lock_guard<std::mutex> lock(mu_);
  auto started = StartExporter(nvml_, inventory, flags_);
  if (!started.ok()) return started.status();
  exporter_ = std::move(started).value();
  spdlog::info("event={}_started address={}", name_, flags_.address);
  return Status::Ok();
}

void ExporterHost::Replace(const gpu::Inventory& inventory) {
  std::lock_guard<std::mutex> lock(mu_);
  if (exporter_) exporter_->Stop();
  exporter_.reset();
  auto started = StartExporter(nvml_, inventory, flags_);
  if (!started.ok()) {
    spdlog::error("event={}_restart_failed error=\"{}\"", name_, started.status().message());
    return;
  }
  exporter_ = std::move(started).value();
  spdlog::info("event={}_restarted reason=inventory_changed gpus={} mig_devices={}", name_,
               inventory.gpus.size(), inventory.MigDeviceCount());
}

void ExporterHost::ReloadCounters(bool only_if_changed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!exporter_ || (only_if_changed && !exporter_->CountersFileChanged())) return;
  (void)exporter_->ReloadCounters();  // logged; the previous counters stay on error
}

void ExporterHost::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (exporter_) exporter_->Stop();
  exporter_.reset();
}

void LimitMallocArenas() {
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
}

}  // namespace gpulet::cli
