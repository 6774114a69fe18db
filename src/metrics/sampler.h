// Sampler: reads every configured field of every GPU (or MIG GPU instance) through NVML into a
// Snapshot. Not thread-safe: owned and called by the collector thread only. It takes the NVML
// function table rather than gpu::Nvml so tests can hand it a table of their own.
//
// Per call: each NVML query runs at most once per entity (utilisation feeds two fields), a GPU
// whose queries return NVML_ERROR_GPU_IS_LOST is marked down for this collection (and read again
// next time), and a field the driver does not support on a device is logged once and left out.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gpu/inventory.h"
#include "gpu/nvml.h"
#include "metrics/snapshot.h"

namespace gpulet::metrics {

// The last XID seen per physical GPU, written by the event thread, read by the sampler.
class XidLog {
 public:
  void Record(unsigned gpu, uint64_t xid);
  uint64_t Last(unsigned gpu) const;  // 0 when none seen

 private:
  mutable std::mutex mu_;
  std::map<unsigned, uint64_t> last_;
};

class Sampler {
 public:
  Sampler(const gpu::NvmlFunctions& fn, gpu::Inventory inventory, std::string hostname,
          const XidLog* xids);

  Snapshot Sample(std::shared_ptr<const CounterSet> counters);

  const gpu::Inventory& inventory() const { return inventory_; }
  // The handle of physical GPU `index` (null until NVML gives one).
  nvmlDevice_t Handle(unsigned index);

 private:
  struct Target;  // one entity to read
  const gpu::NvmlFunctions& fn_;
  gpu::Inventory inventory_;
  std::string hostname_;
  const XidLog* xids_;
  std::vector<nvmlDevice_t> handles_;
  std::map<std::pair<unsigned, unsigned>, nvmlDevice_t> mig_handles_;  // (gpu, mig_index)
  std::set<std::string> logged_unsupported_;
  std::set<unsigned> logged_lost_;
};

}  // namespace gpulet::metrics
