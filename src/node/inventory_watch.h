// The node's current inventory, re-discovered on demand: what the plugin's and the exporter's
// rescans share. A re-discovery that finds the same GPUs and MIG devices changes nothing; one that
// finds others publishes a new inventory under a new generation. While `gpulet mig apply` holds
// the MIG layout lock (mig/layout_lock.h) a rescan is deferred, so a layout half-way through an
// apply is never published.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "gpu/inventory.h"

namespace gpulet::node {

enum class RescanOutcome {
  kUnchanged,  // same devices
  kChanged,    // a new inventory (and generation) is current
  kDeferred,   // a MIG apply holds the layout lock; try again soon
  kFailed,     // discovery failed; the current inventory stays (logged)
};
const char* RescanOutcomeName(RescanOutcome outcome);

// Reads the node once (gpu::Discover over the caller's NVML session).
using DiscoverFn = std::function<Result<gpu::Inventory>()>;

// Thread-safe.
class InventoryWatch {
 public:
  // `lock_path`: the MIG layout lock file; empty: no lock taken.
  InventoryWatch(std::shared_ptr<const gpu::Inventory> initial, DiscoverFn discover,
                 std::string lock_path);

  // The current inventory and its generation (0 for the initial one, +1 per change).
  std::shared_ptr<const gpu::Inventory> Current(uint64_t* generation = nullptr) const;

  // Discovers the node again under the shared layout lock.
  RescanOutcome Rescan();

 private:
  const DiscoverFn discover_;
  const std::string lock_path_;
  std::mutex rescan_mu_;   // one rescan at a time
  bool deferred_ = false;  // guarded by rescan_mu_: log a deferral once per apply
  mutable std::mutex mu_;
  std::shared_ptr<const gpu::Inventory> inventory_;
  uint64_t generation_ = 0;
};

}  // namespace gpulet::node
