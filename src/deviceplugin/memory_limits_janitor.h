// Removes the per-container directories of memory-limited allocations (memory_limits.h) once the
// kubelet's pod-resources API no longer lists their devices: the device plugin is never told
// that a container ended, so it asks the kubelet what is still allocated.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

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

// Every device ID the kubelet lists (pod-resources v1 List), and who holds it. kUnavailable
// when the socket is missing or the call fails.
Result<std::map<std::string, PodContainer>> ListPodDevices(const std::string& socket,
                                                           std::chrono::milliseconds timeout);

// The state directories of `settings` (one per distinct stateDir).
std::set<std::string> StateDirsOf(const std::map<std::string, MemoryLimitSettings>& settings);

class MemoryLimitJanitor {
 public:
  // Nothing runs when `state_dirs` is empty.
  // `socket`: empty means $GPULET_POD_RESOURCES_SOCKET, else kPodResourcesSocket.
  explicit MemoryLimitJanitor(std::set<std::string> state_dirs, std::string socket = "",
                              std::chrono::seconds interval = std::chrono::seconds(30),
                              std::chrono::seconds grace = std::chrono::seconds(120));
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
  std::chrono::seconds interval_, grace_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace gpulet::deviceplugin
