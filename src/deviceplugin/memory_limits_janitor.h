// Ends the per-container directories of memory-limited allocations (memory_limits.h) once their
// container has ended. The device plugin is never told that a container ended, so it asks the
// kubelet's pod-resources API what is still allocated, and it never takes one List as the whole
// truth: right after a kubelet restart a List can be empty or partial. A device ID counts as
// released only when DeviceAbsence confirms it: missing from several consecutive Lists of the
// same kubelet, spanning a minimum time, all begun after the directory was first seen. A new
// kubelet (its pod-resources socket replaced: another inode or change time) starts the evidence
// over. A directory a newer Allocate superseded (one of its IDs handed out again) ends at once.
// The memory pool's publisher (memory_publisher.h) releases units by the same rule.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "deviceplugin/memory_limits.h"
#include "deviceplugin/pod_resources_client.h"

namespace gpulet::deviceplugin {

struct PodContainer {
  std::string namespace_;
  std::string pod;
  std::string container;
  bool operator==(const PodContainer&) const = default;
};

// Which kubelet answered: the identity of its pod-resources socket file. A restarted kubelet
// creates the socket anew.
struct KubeletInstance {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t ctime_ns = 0;
  bool operator==(const KubeletInstance&) const = default;
};

// One pod-resources List: every device ID the kubelet lists and who holds it, and which kubelet.
struct PodDeviceList {
  std::map<std::string, PodContainer> devices;
  KubeletInstance kubelet;
};

// Lists the kubelet on `socket`. kUnavailable when the socket is missing, the call fails, or the
// socket was replaced during the call (a kubelet restart: the answer may be either kubelet's).
Result<PodDeviceList> ListPodDevices(const std::string& socket, std::chrono::milliseconds timeout);

// The state directories of `settings` (one per distinct stateDir).
std::set<std::string> StateDirsOf(const std::map<std::string, MemoryLimitSettings>& settings);

struct AbsenceOptions {
  int lists = 3;                  // consecutive Lists that must all miss an ID
  std::chrono::seconds span{60};  // from the first of them to the last, at least
  bool operator==(const AbsenceOptions&) const = default;
};

// The evidence that device IDs left the kubelet's lists. Not thread-safe (one owner).
class DeviceAbsence {
 public:
  explicit DeviceAbsence(AbsenceOptions options = {}) : options_(options) {}

  // One successful List, begun at `now`.
  void Observe(const std::set<std::string>& listed, const KubeletInstance& kubelet,
               Clock::TimePoint now);
  // Whether `id` is confirmed gone: the Lists of the current kubelet begun at or after
  // `not_before` and after the last List that named `id` are at least `lists` and span at least
  // `span`. False before any List.
  bool Gone(const std::string& id, Clock::TimePoint not_before) const;
  // Same for a set of IDs: all of them gone (an empty set: the Lists alone must qualify).
  bool AllGone(const std::vector<std::string>& ids, Clock::TimePoint not_before) const;
  // Named by the latest List.
  bool Listed(const std::string& id) const;

 private:
  bool Confirmed(Clock::TimePoint after_or_at) const;

  const AbsenceOptions options_;
  bool observed_ = false;
  KubeletInstance kubelet_;
  std::deque<Clock::TimePoint> lists_;                 // begin times, current kubelet, oldest first
  std::map<std::string, Clock::TimePoint> last_seen_;  // ID -> the latest List naming it
  std::set<std::string> latest_;
};

struct JanitorOptions {
  std::chrono::seconds interval{30};
  AbsenceOptions absence;
  Clock* clock = nullptr;  // nullptr: RealClock()
};

class MemoryLimitJanitor {
 public:
  // Nothing runs when `state_dirs` is empty.
  // `socket`: empty means $GPULET_POD_RESOURCES_SOCKET, else kPodResourcesSocket.
  explicit MemoryLimitJanitor(std::set<std::string> state_dirs, std::string socket = "",
                              JanitorOptions options = {});
  ~MemoryLimitJanitor();  // Stop()s
  MemoryLimitJanitor(const MemoryLimitJanitor&) = delete;
  MemoryLimitJanitor& operator=(const MemoryLimitJanitor&) = delete;

  // One pass: the directories removed. While the kubelet cannot be asked, nothing is removed
  // (kUnavailable): an unreachable kubelet says nothing about what ended.
  Result<std::vector<std::string>> RunOnce();
  void Start();
  void Stop();

 private:
  std::set<std::string> state_dirs_;
  std::string socket_;
  JanitorOptions options_;
  Clock& clock_;
  DeviceAbsence absence_;                               // RunOnce's (one thread at a time)
  std::map<std::string, Clock::TimePoint> first_seen_;  // directory path -> first pass seeing it
  std::mutex run_mu_;
  StopSignal stop_;
  std::thread thread_;
};

}  // namespace gpulet::deviceplugin
