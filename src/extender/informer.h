// CollectionWatcher: keeps a collection of objects in sync the way an informer does, for the
// extender's two sources (the per-node GPU memory ConfigMaps by label selector, and the Nodes):
//   1. LIST the collection (with the label selector); on_list gets every item, and the list's
//      resourceVersion is where the watch starts.
//   2. WATCH from there; on_event gets ADDED/MODIFIED/DELETED with the object.
//   3. When the stream ends, watch again from the last resourceVersion; when it breaks, the same
//      after a backoff; on 410 Gone, go back to 1.
// (k8s/watch.h follows one named object; this follows a selected set.)
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "k8s/client.h"
#include "k8s/watch.h"

namespace gpulet::extender {

class CollectionWatcher {
 public:
  using OnList = std::function<void(const std::vector<nlohmann::json>& items)>;
  using OnEvent = std::function<void(const std::string& type, const nlohmann::json& object)>;

  // `collection_path`: "/api/v1/nodes", "/api/v1/namespaces/NS/configmaps".
  CollectionWatcher(const k8s::Client& client, std::string collection_path,
                    std::string label_selector, k8s::WatcherOptions options = {});

  // Blocks until stop.
  void Run(k8s::StopSignal& stop, const OnList& on_list, const OnEvent& on_event);

  bool synced() const { return synced_.load(); }  // the first LIST arrived
  const k8s::WatcherStats& stats() const { return stats_; }

 private:
  const k8s::Client& client_;
  const std::string path_;
  const std::string selector_;
  const k8s::WatcherOptions options_;
  k8s::WatcherStats stats_;
  std::atomic<bool> synced_{false};
};

}  // namespace gpulet::extender
