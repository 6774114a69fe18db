// The collector thread and the rendered-exposition cache.
//
//   Collector (thread, every interval or when woken) ─Sample()─▶ Publisher.SetSnapshot
//   PodResourcesWatcher (thread)                      ─────────▶ Publisher.SetPods
//   XidWatcher (thread, NVML events) ─XidLog + Wake()─▶ Collector
//   HTTP workers ─Publisher.Current()─▶ an immutable Rendered, written out as is
//
// Scrapes never touch NVML and never render: they copy a shared_ptr under a mutex. A counters
// reload swaps the CounterSet the next collection uses; until that collection finishes, scrapes
// keep getting the previous rendering, so /metrics has no gap.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "metrics/exposition.h"
#include "metrics/sampler.h"

namespace gpulet::metrics {

// One collection rendered in both formats.
struct Rendered {
  std::string text;         // text format 0.0.4
  std::string openmetrics;  // OpenMetrics 1.0
  int64_t collected_at_ms = 0;
  size_t series = 0;        // sample lines in `text`
  uint64_t generation = 0;  // increases with every rendering
};

class Publisher {
 public:
  explicit Publisher(bool series_per_pod = true, bool pod_uid_label = false)
      : series_per_pod_(series_per_pod), pod_uid_label_(pod_uid_label) {}

  void SetSnapshot(std::shared_ptr<const Snapshot> snapshot);
  // Re-renders only when the map differs from the current one.
  void SetPods(PodMap pods);
  // Slurm jobs per GPU (hpc_job); re-renders only on a change.
  void SetJobs(JobMap jobs);
  // Series of gpulet's own families rendered elsewhere (text format, HELP/TYPE included, e.g.
  // metrics/memory_limits.h), appended to every rendering; re-renders only on a change.
  void SetExtra(std::string text);
  // Null until the first snapshot.
  std::shared_ptr<const Rendered> Current() const;

 private:
  void RenderLocked();  // holds render_mu_

  const bool series_per_pod_;
  const bool pod_uid_label_;
  std::mutex render_mu_;  // serialises renderings; guards snapshot_ and pods_
  std::shared_ptr<const Snapshot> snapshot_;
  PodMap pods_;
  JobMap jobs_;
  std::string extra_;
  uint64_t generation_ = 0;
  mutable std::mutex current_mu_;
  std::shared_ptr<const Rendered> current_;
};

class Collector {
 public:
  // Ticks on `clock` (a test passes a FakeClock and advances it).
  Collector(Sampler& sampler, std::shared_ptr<const CounterSet> counters,
            std::chrono::milliseconds interval, Publisher& publisher, Clock& clock = RealClock());
  ~Collector();  // Stop()s
  Collector(const Collector&) = delete;
  Collector& operator=(const Collector&) = delete;

  // Runs one collection on the caller's thread (so /metrics has data from the start), then
  // starts the thread.
  void Start();
  void Stop();
  // The next collection (started now) uses `counters`.
  void SetCounters(std::shared_ptr<const CounterSet> counters);
  // Collect now instead of at the next tick (an XID arrived, counters changed).
  void Wake();
  uint64_t collections() const { return collections_.load(); }
  // Called on the collector thread before each snapshot is published (set before Start).
  void SetBeforePublish(std::function<void()> hook) { before_publish_ = std::move(hook); }

 private:
  void CollectOnce();
  void Run();

  Sampler& sampler_;
  const std::chrono::milliseconds interval_;
  Publisher& publisher_;
  Clock& clock_;
  std::mutex mu_;
  std::shared_ptr<const CounterSet> counters_;  // guarded by mu_
  bool wake_ = false;                           // guarded by mu_
  bool stop_ = false;                           // guarded by mu_
  std::shared_ptr<StopSignal> sleep_;           // the current wait; Wake/Stop end it
  std::atomic<uint64_t> collections_{0};
  std::function<void()> before_publish_;
  std::thread thread_;
};

// Follows XID critical-error events through its own NVML event set and records the last XID of
// each GPU in an XidLog (DCGM_FI_DEV_XID_ERRORS). Registration failures are logged once per GPU;
// with no GPU registered the watcher does not run and the XID field stays 0.
class XidWatcher {
 public:
  // handles[i] is the NVML handle of GPU index i (null: skip that GPU).
  XidWatcher(const gpu::NvmlFunctions& fn, std::vector<nvmlDevice_t> handles, XidLog& log,
             std::function<void()> on_xid);
  ~XidWatcher();
  XidWatcher(const XidWatcher&) = delete;
  XidWatcher& operator=(const XidWatcher&) = delete;

  void Start();
  void Stop();

 private:
  void Run();

  const gpu::NvmlFunctions& fn_;
  std::vector<nvmlDevice_t> handles_;
  XidLog& log_;
  std::function<void()> on_xid_;
  nvmlEventSet_t set_ = nullptr;
  StopSignal stop_;
  std::thread thread_;
};

}  // namespace gpulet::metrics
