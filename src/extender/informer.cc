#include "extender/informer.h"

#include <spdlog/spdlog.h>

namespace gpulet::extender {

CollectionWatcher::CollectionWatcher(const k8s::Client& client, std::string collection_path,
                                     std::string label_selector, k8s::WatcherOptions options)
    : client_(client),
      path_(std::move(collection_path)),
      selector_(std::move(label_selector)),
      options_(options) {}

void CollectionWatcher::Run(k8s::StopSignal& stop, const OnList& on_list, const OnEvent& on_event) {
  bool need_list = true;
  std::string rv;
  std::chrono::milliseconds backoff = options_.initial_backoff;
  const std::string selector =
      selector_.empty() ? "" : "labelSelector=" + k8s::EscapeQueryValue(selector_);
  auto fail_wait = [&]() {
    ++stats_.reconnects;
    const bool stopped = stop.WaitFor(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
    return stopped;
  };
  while (!stop.stopped()) {
    if (need_list) {
      ++stats_.lists;
      auto got = client_.Get(path_ + (selector.empty() ? "" : "?" + selector));
      if (!got.ok() || !got->is_object()) {
        spdlog::warn("event=k8s_list_failed collection={} error=\"{}\"", path_,
                     got.ok() ? "not an object" : got.status().message());
        if (fail_wait()) return;
        continue;
      }
      std::vector<nlohmann::json> items;
      if (got->contains("items") && (*got)["items"].is_array()) {
        for (const auto& item : (*got)["items"]) items.push_back(item);
      }
      rv = got->contains("metadata") && (*got)["metadata"].is_object()
               ? (*got)["metadata"].value("resourceVersion", "")
               : "";
      on_list(items);
      synced_ = true;
      need_list = false;
    }
    std::string query = "?watch=1&allowWatchBookmarks=true&timeoutSeconds=" +
                        std::to_string(options_.timeout_seconds);
    if (!selector.empty()) query += "&" + selector;
    if (!rv.empty()) query += "&resourceVersion=" + k8s::EscapeQueryValue(rv);
    ++stats_.watches;
    bool got_event = false;
    k8s::WatchResult r = client_.Watch(
        path_ + query,
        [&](const k8s::WatchEvent& ev) {
          got_event = true;
          if (ev.object.is_object() && ev.object.contains("metadata") &&
              ev.object["metadata"].is_object()) {
            const std::string v = ev.object["metadata"].value("resourceVersion", "");
            if (!v.empty()) rv = v;
          }
          if (ev.type == "ADDED" || ev.type == "MODIFIED" || ev.type == "DELETED") {
            on_event(ev.type, ev.object);
          }
          return !stop.stopped();
        },
        stop.flag());
    if (got_event) backoff = options_.initial_backoff;
    switch (r.end) {
      case k8s::WatchEnd::kStopped:
        return;
      case k8s::WatchEnd::kClosed:
        break;
      case k8s::WatchEnd::kGone:
        ++stats_.gone;
        spdlog::info("event=k8s_watch_gone collection={} action=relist", path_);
        need_list = true;
        break;
      case k8s::WatchEnd::kBroken:
      case k8s::WatchEnd::kFailed:
        spdlog::warn("event=k8s_watch_broken collection={} retry_ms={} error=\"{}\"", path_,
                     backoff.count(), r.error.message());
        if (fail_wait()) return;
        break;
    }
  }
}

}  // namespace gpulet::extender
