// The two informer-style watch loops, one loop underneath:
//   ObjectWatcher follows one named object (a Node, a ConfigMap);
//   CollectionWatcher follows a label-selected collection (the extender's per-node ConfigMaps,
//   the Nodes).
// Both run the same loop (WatchLoop):
//   1. LIST the source (GET the object, or LIST the collection); its resourceVersion is where the
//      watch starts. A failed LIST is retried after a backoff.
//   2. WATCH from that resourceVersion.
//   3. When the stream ends, watch again from the last resourceVersion seen; when it breaks (or
//      the request fails), the same after a backoff; on 410 Gone the version is too old: go back
//      to 1 (re-list). The backoff doubles up to max_backoff and goes back to initial_backoff
//      once a watch delivered an event. StopSignal::Stop() ends the loop, waking a backoff wait.
// ObjectWatcher: GET the object (404 means "absent"), WATCH with
// fieldSelector=metadata.name=<name>. on_change receives the object after every GET and every
// ADDED/MODIFIED event, and nullopt when the object is absent or DELETED. Callers compare
// contents; the watcher does not de-duplicate.
// CollectionWatcher: LIST with the label selector (on_list gets every item), WATCH with it
// (on_event gets ADDED/MODIFIED/DELETED with the object); synced() once the first LIST arrived.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

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

// The items of a List answer, moved out of it (no copy of their trees: a LIST of thousands of
// objects is hundreds of MiB of tree); empty when it has none.
std::vector<nlohmann::json> ItemsOf(nlohmann::json&& list);
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

// The loop both watchers share (see the file comment); not used directly.
class WatchLoop {
 public:
  const WatcherStats& stats() const { return stats_; }
  // The last resourceVersion seen: where the next watch starts.
  std::string resource_version() const;

 protected:
  // What differs between the watchers.
  struct Source {
    // Names the source in log lines: "object=nodes/n1", "collection=/api/v1/nodes".
    std::string subject;
    // The log event of a failed LIST: "k8s_get_failed", "k8s_list_failed".
    std::string list_failed_event;
    // The watch request without resourceVersion: "<collection>?watch=1&...".
    std::string watch_path;
    // One LIST: records the resourceVersion to watch from (set_resource_version) and hands the
    // result on; an error makes the loop back off and list again.
    std::function<Status()> list;
    // An ADDED, MODIFIED or DELETED event (after the version was recorded).
    std::function<void(const std::string& type, const nlohmann::json& object)> on_event;
  };

  WatchLoop(const Client& client, WatcherOptions options) : client_(client), options_(options) {}
  ~WatchLoop() = default;  // owned as the watcher it is part of, never as a WatchLoop
  // Blocks until stop.
  void Loop(StopSignal& stop, const Source& source);
  void set_resource_version(const std::string& rv);

  const Client& client_;
  const WatcherOptions options_;

 private:
  WatcherStats stats_;
  mutable std::mutex mu_;
  std::string resource_version_;
};

class ObjectWatcher : public WatchLoop {
 public:
  using OnChange = std::function<void(const std::optional<nlohmann::json>&)>;

  ObjectWatcher(const Client& client, ObjectRef ref, WatcherOptions options = {});

  // Blocks until stop; see the file comment.
  void Run(StopSignal& stop, const OnChange& on_change);

 private:
  ObjectRef ref_;
};

class CollectionWatcher : public WatchLoop {
 public:
  using OnList = std::function<void(const std::vector<nlohmann::json>& items)>;
  using OnEvent = std::function<void(const std::string& type, const nlohmann::json& object)>;

  // `collection_path`: "/api/v1/nodes", "/api/v1/namespaces/NS/configmaps"; an empty
  // `label_selector` selects every object of the collection.
  CollectionWatcher(const Client& client, std::string collection_path, std::string label_selector,
                    WatcherOptions options = {});

  // Blocks until stop; see the file comment.
  void Run(StopSignal& stop, const OnList& on_list, const OnEvent& on_event);

  bool synced() const { return synced_.load(); }  // the first LIST arrived

 private:
  const std::string path_;
  const std::string selector_;
  std::atomic<bool> synced_{false};
};

}  // namespace gpulet::k8s
