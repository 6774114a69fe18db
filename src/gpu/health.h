// GPU health: one owner of "which physical GPUs and MIG devices are healthy", fed by the NVML event
// API and a periodic probe, read by every listener (ListAndWatch streams, metrics) through a
// versioned snapshot.
//
//   HealthMonitor (thread) ──events/probes──▶ HealthTracker (pure rules, injectable clock)
//                                                   │ publishes
//                                                   ▼
//                                            HealthBoard: snapshot{version, per-UUID health}
//                                                   │ WaitNewer(version)
//                                                   ▼
//                                  ListAndWatch streams, exporter, …
//
// Rules (NVIDIA's k8s-device-plugin semantics, plus recovery):
// - An XID critical error marks the GPU (or the MIG device named by the event's GI/CI ids)
//   unhealthy unless the XID is ignored. Ignored by default: 13, 31, 43, 45, 68, 109 (application
//   errors). DP_DISABLE_HEALTHCHECKS: "all" turns every check off; "xids" ignores every XID; a
//   comma list of numbers ignores those XIDs in addition. DP_ENABLE_HEALTHCHECKS: a comma list of
//   XIDs that count even if ignored by default; "all"/"xids" makes every XID count.
// - A double-bit ECC event marks the GPU unhealthy; single-bit ECC events are only logged.
// - A probe that returns NVML_ERROR_GPU_IS_LOST marks the GPU unhealthy.
// - Beyond NVIDIA: an unhealthy GPU becomes healthy again once `quiet_period` has passed with no
//   new critical event and a probe succeeds. A zero quiet period disables recovery.
// - Health outlives re-discovery: a tracker built for a new inventory (a MIG re-layout) over the
//   same board keeps every UUID's health; an inherited unhealthy device counts its quiet period
//   from then. Events fire once, so forgetting them would advertise a failed GPU Healthy for good.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "gpu/inventory.h"

namespace gpulet::gpu {

class Nvml;

struct DeviceHealth {
  bool healthy = true;
  std::string reason;  // why it is unhealthy ("XID 79", "double-bit ECC", "GPU is lost"); empty
                       // when healthy
  bool operator==(const DeviceHealth&) const = default;
};

// Health of every physical GPU and MIG device, keyed by UUID ("GPU-…", "MIG-…").
struct HealthSnapshot {
  uint64_t version = 0;
  std::map<std::string, DeviceHealth> devices;

  // A UUID the snapshot does not know is healthy.
  const DeviceHealth& Get(const std::string& uuid) const;
};

// The one place health lives. Thread-safe. Writers replace entries and bump the version; readers
// take copies or wait for a newer version.
class HealthBoard {
 public:
  HealthSnapshot Current() const;
  // Blocks until the version exceeds `seen`, `stop()` returns true, or `timeout` passes; returns
  // the current snapshot either way. `stop` is evaluated under the board's lock after every wake.
  HealthSnapshot WaitNewer(uint64_t seen, std::chrono::milliseconds timeout,
                           const std::function<bool()>& stop = {}) const;
  // Replaces the given entries; bumps the version (and wakes waiters) only if something changed.
  // Returns true if it did.
  bool Update(const std::map<std::string, DeviceHealth>& changes);
  // Wakes every waiter without changing the state (they re-check their stop predicate).
  void Wake() const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  HealthSnapshot snapshot_;
};

// Which XIDs count, from DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS.
struct HealthPolicy {
  bool all_disabled = false;      // DP_DISABLE_HEALTHCHECKS=all: no checks at all
  bool all_xids_ignored = false;  // every XID ignored (probe and ECC still count)
  std::set<uint64_t> ignored_xids;
  std::chrono::milliseconds quiet_period{std::chrono::minutes(1)};  // 0: never recover

  bool XidCounts(uint64_t xid) const { return !all_xids_ignored && !ignored_xids.count(xid); }
};

// The default ignored application XIDs.
const std::set<uint64_t>& DefaultIgnoredXids();

// Builds the policy from the two variables' values (empty = unset). Errors (kInvalidInput) name
// the variable and the bad entry.
Result<HealthPolicy> ParseHealthPolicy(const std::string& disable_env,
                                       const std::string& enable_env);

// Physical GPU or MIG device an event or probe refers to.
struct HealthTarget {
  std::string uuid;         // the GPU or MIG UUID
  std::string parent_uuid;  // for MIG devices: the parent GPU; empty for GPUs
};

// The pure rules. Not thread-safe: owned by one thread (HealthMonitor's), publishes to a board.
class HealthTracker {
 public:
  // Devices the board already knows keep their health (see above); new ones start healthy.
  HealthTracker(const Inventory& inventory, HealthPolicy policy, const Clock& clock,
                HealthBoard& board);

  enum class EventKind { kXid, kDoubleBitEcc, kSingleBitEcc };
  // An NVML event on physical GPU `gpu_index`; gi/ci name a MIG device when both are set and
  // match one (NVML reports 0xFFFFFFFF for "not a MIG event").
  void OnEvent(unsigned gpu_index, EventKind kind, uint64_t data,
               std::optional<unsigned> gpu_instance = std::nullopt,
               std::optional<unsigned> compute_instance = std::nullopt);
  // Result of probing one GPU: ok, lost, or another error (which does not change health).
  enum class ProbeResult { kOk, kLost, kOtherError };
  // Applies probe results (index = GPU index) and the recovery rule.
  void OnProbe(const std::vector<ProbeResult>& results);

  const HealthPolicy& policy() const { return policy_; }

 private:
  struct State {
    DeviceHealth health;
    Clock::TimePoint last_bad{};
  };
  void MarkBad(const std::string& uuid, const std::string& reason);
  void Publish();

  const Inventory& inventory_;
  HealthPolicy policy_;
  const Clock& clock_;
  HealthBoard& board_;
  std::map<std::string, State> state_;  // every GPU and MIG UUID
  std::map<std::string, DeviceHealth> pending_;
};

struct HealthMonitorOptions {
  HealthPolicy policy;
  std::chrono::milliseconds event_wait{100};       // nvmlEventSetWait_v2 timeout (stop latency)
  std::chrono::milliseconds probe_interval{1000};  // GPU_IS_LOST probe and recovery check
};

// Runs the NVML event loop and the probe on one thread, feeding a HealthTracker.
class HealthMonitor {
 public:
  // Waits (between probes, after a failed event wait) through `clock`.
  HealthMonitor(std::shared_ptr<const Nvml> nvml, const Inventory& inventory,
                HealthMonitorOptions options, Clock& clock, HealthBoard& board);
  ~HealthMonitor();  // Stop()s
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  // Registers for events and starts the thread. With policy.all_disabled, starts nothing.
  // Registration failures on a GPU are logged, and that GPU relies on the probe alone.
  Status Start();
  void Stop();

 private:
  void Run();

  std::shared_ptr<const Nvml> nvml_;
  const Inventory& inventory_;
  HealthMonitorOptions options_;
  Clock& clock_;
  HealthTracker tracker_;
  void* event_set_ = nullptr;         // nvmlEventSet_t
  std::vector<void*> handles_;        // nvmlDevice_t per GPU index (null when unavailable)
  std::unique_ptr<StopSignal> stop_;  // one per Start()
  std::thread thread_;
};

}  // namespace gpulet::gpu
