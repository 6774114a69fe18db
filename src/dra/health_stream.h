// The DRAResourceHealth stream's contents (plugin.h SetDeviceHealth), fed from the node's NVML
// health watch (node/health_watch.h writes the gpu::HealthBoard, keyed by UUID).
//
// Each message is the complete list (../shared/references/dra.md 1.3): for every GPU of the
// inventory, gpu-<index> and gpu-<index>-mem (the whole GPU and its memory shares) with the GPU's
// health and reason; for every MIG device the inventory holds, the gpu-<i>-mig-<slug>-<start>
// names of prepared claims cannot be known here, so a MIG device's health is folded into its
// parent: an unhealthy MIG device makes its parent's entries Unhealthy with that reason.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "dra/plugin.h"
#include "gpu/health.h"
#include "gpu/inventory.h"

namespace gpulet::dra {

std::vector<DeviceHealthReport> HealthReports(const gpu::Inventory& inventory,
                                              const gpu::HealthSnapshot& health);

// Sends HealthReports to the plugin at once and after every change of the board, until Stop().
class HealthFeeder {
 public:
  HealthFeeder(DraPlugin& plugin, const gpu::HealthBoard& board,
               std::shared_ptr<const gpu::Inventory> inventory);
  ~HealthFeeder();  // Stop()s
  HealthFeeder(const HealthFeeder&) = delete;
  HealthFeeder& operator=(const HealthFeeder&) = delete;
  void Start();
  void Stop();

 private:
  DraPlugin& plugin_;
  const gpu::HealthBoard& board_;
  std::shared_ptr<const gpu::Inventory> inventory_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gpulet::dra
