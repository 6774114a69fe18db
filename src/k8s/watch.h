// ObjectWatcher: follows one named object (a Node, a ConfigMap) through GET + WATCH, the way an
// informer does for a single object:
//   1. GET the object (its resourceVersion is where the watch starts; 404 means "absent").
//   2. WATCH the collection with fieldSelector=metadata.name=<name> from that resourceVersion.
//   3. When the stream ends or breaks, watch again from the last resourceVersion seen (after a
//      backoff when it broke); on 410 Gone the version is too old: go back to 1 (re-list).
// on_change receives the object after every GET and every ADDED/MODIFIED event, and nullopt when
// the object is absent or DELETED. Callers compare contents; the watcher does not de-duplicate.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "k8s/client.h"

namespace gpulet::k8s {

// A stop request that wakes sleepers (backoff waits) at once.
class StopSignal {
 public:
  void Stop();
  bool stopped() const { return flag_.load(); }
  const std::atomic<bool>* flag() const { return &flag_; }
  // Waits up to `d`; true when stopped.
  bool WaitFor(std::chrono::milliseconds d);

 private:
  std::atomic<bool> flag_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

struct ObjectRef {
  std::string collection_path;  // "/api/v1/nodes", "/api/v1/namespaces/ns/configmaps"
  std::string name;
  std::string ObjectPath() const { return collection_path + "/" + name; }
  std::string Describe() const;  // "nodes/n1", "configmaps/ns/name"
};

ObjectRef NodeRef(const std::string& node_name);
ObjectRef ConfigMapRef(const std::string& ns, const std::string& name);

struct WatcherOptions {
  std::chrono::milliseconds initial_backoff{500};
  std::chrono::milliseconds max_backoff{30000};
  int timeout_seconds = 300;  // asked of the server per watch request
};

struct WatcherStats {
  std::atomic<uint64_t> lists{0};       // GETs (initial and after 410)
  std::atomic<uint64_t> watches{0};     // watch requests started
  std::atomic<uint64_t> reconnects{0};  // after a broken stream or a failed request
  std::atomic<uint64_t> gone{0};        // 410 Gone answers
};

class ObjectWatcher {
 public:
  using OnChange = std::function<void(const std::optional<nlohmann::json>&)>;

  ObjectWatcher(const Client& client, ObjectRef ref, WatcherOptions options = {});

  // Blocks until stop; see the file comment.
  void Run(StopSignal& stop, const OnChange& on_change);

  const WatcherStats& stats() const { return stats_; }
  std::string resource_version() const;

 private:
  const Client& client_;
  ObjectRef ref_;
  WatcherOptions options_;
  WatcherStats stats_;
  mutable std::mutex mu_;
  std::string resource_version_;
};

}  // namespace gpulet::k8s
