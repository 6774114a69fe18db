// Keeps one gpu::HealthMonitor watching the node's current inventory. When a rescan finds other
// devices, Follow() replaces the monitor; health lives on the HealthBoard keyed by UUID, so a GPU
// that went unhealthy (an XID fires once) stays unhealthy across the replacement.
#pragma once

#include <memory>
#include <mutex>

#include "common/clock.h"
#include "common/status.h"
#include "gpu/health.h"
#include "gpu/inventory.h"

namespace gpulet::gpu {
class Nvml;
}

namespace gpulet::node {

// Thread-safe.
class HealthWatch {
 public:
  HealthWatch(std::shared_ptr<const gpu::Nvml> nvml, gpu::HealthMonitorOptions options,
              Clock& clock, gpu::HealthBoard& board);
  ~HealthWatch();  // Stop()s
  HealthWatch(const HealthWatch&) = delete;
  HealthWatch& operator=(const HealthWatch&) = delete;

  Status Start(std::shared_ptr<const gpu::Inventory> inventory);
  // Watches `inventory` from now on (errors are logged; the probe-less state is reported).
  void Follow(std::shared_ptr<const gpu::Inventory> inventory);
  void Stop();

 private:
  Status StartLocked(std::shared_ptr<const gpu::Inventory> inventory);

  const std::shared_ptr<const gpu::Nvml> nvml_;
  const gpu::HealthMonitorOptions options_;
  Clock& clock_;
  gpu::HealthBoard& board_;
  std::mutex mu_;
  std::shared_ptr<const gpu::Inventory> inventory_;  // what monitor_ references
  std::unique_ptr<gpu::HealthMonitor> monitor_;
};

}  // namespace gpulet::node
