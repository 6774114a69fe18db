// Sampler: reads every configured field of every GPU (or MIG GPU instance) through NVML into a
// Snapshot. Not thread-safe: owned and called by the collector thread only. It takes the NVML
// function table rather than gpu::Nvml so tests can hand it a table of their own.
//
// Per call: each NVML query runs at most once per entity (utilisation feeds two fields), a GPU
// whose queries return NVML_ERROR_GPU_IS_LOST is marked down for this collection (and read again
// next time), and a field the driver does not support on a device is logged once and left out.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gpu/inventory.h"
#include "gpu/nvml.h"
#include "metrics/processes.h"
#include "metrics/snapshot.h"

namespace gpulet::metrics {

// The XIDs seen per physical GPU, written by the event thread, read by the sampler: the last one
// (DCGM_FI_DEV_XID_ERRORS) and how many of each code arrived within the count window
// (dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT, --xid-count-window-size). Thread-safe.
class XidLog {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  void Record(unsigned gpu, uint64_t xid);
  void Record(unsigned gpu, uint64_t xid, TimePoint at);
  uint64_t Last(unsigned gpu) const;  // 0 when none seen

  void SetCountWindow(std::chrono::milliseconds window);
  // XID code → how many arrived in (now - window, now]; empty when none.
  std::map<uint64_t, int64_t> CountsInWindow(unsigned gpu) const;
  std::map<uint64_t, int64_t> CountsInWindow(unsigned gpu, TimePoint now) const;

 private:
  static constexpr size_t kMaxEventsPerGpu = 4096;  // oldest dropped beyond this
  mutable std::mutex mu_;
  std::map<unsigned, uint64_t> last_;
  std::map<unsigned, std::deque<std::pair<TimePoint, uint64_t>>> events_;
  std::chrono::milliseconds window_{std::chrono::minutes(5)};
};

// GPM readings of one entity for one collection (see Sampler::ReadGpm).
struct GpmReadings {
  nvmlReturn_t rc = NVML_SUCCESS;  // why nothing was read (not supported, lost, …)
  bool warming = false;            // first sample taken: values come with the next collection
  std::map<unsigned, double> values;  // by NVML_GPM_METRIC_* id, as NVML gives them
};

class Sampler {
 public:
  Sampler(const gpu::NvmlFunctions& fn, gpu::Inventory inventory, std::string hostname,
          const XidLog* xids);
  ~Sampler();  // frees the GPM sample buffers
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  Snapshot Sample(std::shared_ptr<const CounterSet> counters);
  // From now on every entity also carries its compute processes and their pods (cgroups read
  // under `proc_root`): --kubernetes-virtual-gpus's per-pod GPU_UTIL and FB_USED.
  void EnableProcesses(std::string proc_root);

  const gpu::Inventory& inventory() const { return inventory_; }
  // The handle of physical GPU `index` (null until NVML gives one).
  nvmlDevice_t Handle(unsigned index);

 private:
  struct Target;  // one entity to read
  // GPM keeps the previous sample of every entity: metrics are averages between two samples.
  struct GpmState {
    nvmlGpmSample_t prev = nullptr;
    nvmlGpmSample_t next = nullptr;
    bool have_prev = false;
  };
  GpmReadings ReadGpm(nvmlDevice_t parent, const gpu::Gpu& g, const EntityKey& key,
                      const std::vector<unsigned>& metric_ids);
  // Takes the first GPM sample of every entity that has none yet, then waits one short interval
  // once, so even the first collection carries profiling values (instead of every entity
  // waiting a whole collect interval for its second sample).
  void PrimeGpm();
  bool GpmSupported(nvmlDevice_t parent, const gpu::Gpu& g, nvmlReturn_t* rc);
  // One GPM sample of the whole GPU, or of GPU instance key.gpu_instance_id on it.
  nvmlReturn_t TakeGpmSample(nvmlDevice_t parent, const EntityKey& key, nvmlGpmSample_t sample);

  const gpu::NvmlFunctions& fn_;
  gpu::Inventory inventory_;
  std::string hostname_;
  const XidLog* xids_;
  std::vector<nvmlDevice_t> handles_;
  std::map<std::pair<unsigned, unsigned>, nvmlDevice_t> mig_handles_;  // (gpu, mig_index)
  std::set<std::string> logged_unsupported_;
  std::set<unsigned> logged_lost_;
  std::map<unsigned, bool> gpm_supported_;  // by GPU index, once known
  std::map<EntityKey, GpmState> gpm_;
  std::unique_ptr<ProcessReader> processes_;  // null unless EnableProcesses
  std::unique_ptr<nvmlGpmMetricsGet_t> gpm_request_;  // 13 KiB: allocated once, on first use
};

}  // namespace gpulet::metrics
