#include "node/health_watch.h"

#include <spdlog/spdlog.h>

namespace gpulet::node {

HealthWatch::HealthWatch(std::shared_ptr<const gpu::Nvml> nvml, gpu::HealthMonitorOptions options,
                         Clock& clock, gpu::HealthBoard& board)
    : nvml_(std::move(nvml)), options_(std::move(options)), clock_(clock), board_(board) {}

HealthWatch::~HealthWatch() { Stop(); }

Status HealthWatch::StartLocked(std::shared_ptr<const gpu::Inventory> inventory) {
  if (monitor_) monitor_->Stop();
  monitor_.reset();
  inventory_ = std::move(inventory);
  monitor_ = std::make_unique<gpu::HealthMonitor>(nvml_, *inventory_, options_, clock_, board_);
  return monitor_->Start();
}

Status HealthWatch::Start(std::shared_ptr<const gpu::Inventory> inventory) {
  std::lock_guard<std::mutex> l(mu_);
  return StartLocked(std::move(inventory));
}

void HealthWatch::Follow(std::shared_ptr<const gpu::Inventory> inventory) {
  std::lock_guard<std::mutex> l(mu_);
  if (!monitor_) return;  // stopped (or never started): nothing to follow
  Status s = StartLocked(std::move(inventory));
  if (!s.ok()) spdlog::error("event=health_monitor_failed error=\"{}\"", s.message());
}

void HealthWatch::Stop() {
  std::lock_guard<std::mutex> l(mu_);
  if (monitor_) monitor_->Stop();
  monitor_.reset();
}

}  // namespace gpulet::node
