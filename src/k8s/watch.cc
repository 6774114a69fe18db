#include "k8s/watch.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace gpulet::k8s {

void StopSignal::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    flag_.store(true);
  }
  cv_.notify_all();
}

bool StopSignal::WaitFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, d, [this] { return flag_.load(); });
}

std::string ObjectRef::Describe() const {
  const std::string prefix = "/api/v1/";
  std::string c = collection_path.rfind(prefix, 0) == 0 ? collection_path.substr(prefix.size())
                                                        : collection_path;
  // "namespaces/ns/configmaps" → "configmaps/ns"
  if (c.rfind("namespaces/", 0) == 0) {
    const size_t slash = c.find('/', 11);
    if (slash != std::string::npos) c = c.substr(slash + 1) + "/" + c.substr(11, slash - 11);
  }
  return c + "/" + name;
}

ObjectRef NodeRef(const std::string& node_name) { return {"/api/v1/nodes", node_name}; }

ObjectRef ConfigMapRef(const std::string& ns, const std::string& name) {
  return {"/api/v1/namespaces/" + ns + "/configmaps", name};
}

namespace {
// metadata.resourceVersion of an object; "" when it has none.
std::string VersionOf(const nlohmann::json& object) {
  if (!object.is_object() || !object.contains("metadata") || !object["metadata"].is_object()) {
    return "";
  }
  return object["metadata"].value("resourceVersion", "");
}
}  // namespace

std::vector<nlohmann::json> ItemsOf(nlohmann::json&& list) {
  std::vector<nlohmann::json> items;
  auto it = list.is_object() ? list.find("items") : list.end();
  if (it == list.end() || !it->is_array()) return items;
  items.reserve(it->size());
  for (auto& item : *it) items.push_back(std::move(item));
  return items;
}

std::string WatchLoop::resource_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resource_version_;
}

void WatchLoop::set_resource_version(const std::string& rv) {
  std::lock_guard<std::mutex> lock(mu_);
  resource_version_ = rv;
}

void WatchLoop::Loop(StopSignal& stop, const Source& source) {
  bool need_list = true;
  std::chrono::milliseconds backoff = options_.initial_backoff;
  auto fail_wait = [&]() {
    ++stats_.reconnects;
    const bool stopped = stop.WaitFor(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
    return stopped;
  };

  while (!stop.stopped()) {
    if (need_list) {
      ++stats_.lists;
      const Status listed = source.list();
      if (!listed.ok()) {
        spdlog::warn("event={} {} retry_ms={} error=\"{}\"", source.list_failed_event,
                     source.subject, backoff.count(), listed.message());
        if (fail_wait()) return;
        continue;
      }
      need_list = false;
    }

    std::string path = source.watch_path;
    const std::string rv = resource_version();
    if (!rv.empty()) path += "&resourceVersion=" + EscapeQueryValue(rv);
    ++stats_.watches;
    bool got_event = false;
    WatchResult r = client_.Watch(
        path,
        [&](const WatchEvent& ev) {
          got_event = true;
          const std::string v = VersionOf(ev.object);
          if (!v.empty()) set_resource_version(v);
          if (ev.type == "ADDED" || ev.type == "MODIFIED" || ev.type == "DELETED") {
            source.on_event(ev.type, ev.object);
          }
          return !stop.stopped();
        },
        stop.flag());
    if (got_event) backoff = options_.initial_backoff;
    switch (r.end) {
      case WatchEnd::kStopped:
        return;
      case WatchEnd::kClosed:
        spdlog::debug("event=k8s_watch_closed {} resource_version={}", source.subject,
                      resource_version());
        break;
      case WatchEnd::kGone:
        ++stats_.gone;
        spdlog::info("event=k8s_watch_gone {} resource_version={} action=relist", source.subject,
                     resource_version());
        need_list = true;
        break;
      case WatchEnd::kBroken:
      case WatchEnd::kFailed:
        spdlog::warn("event=k8s_watch_broken {} resource_version={} retry_ms={} error=\"{}\"",
                     source.subject, resource_version(), backoff.count(), r.error.message());
        if (fail_wait()) return;
        break;
    }
  }
}

ObjectWatcher::ObjectWatcher(const Client& client, ObjectRef ref, WatcherOptions options)
    : WatchLoop(client, options), ref_(std::move(ref)) {}

void ObjectWatcher::Run(StopSignal& stop, const OnChange& on_change) {
  Source source;
  source.subject = "object=" + ref_.Describe();
  source.list_failed_event = "k8s_get_failed";
  source.watch_path = ref_.collection_path + "?watch=1&allowWatchBookmarks=true&fieldSelector=" +
                      EscapeQueryValue("metadata.name=" + ref_.name) +
                      "&timeoutSeconds=" + std::to_string(options_.timeout_seconds);
  source.list = [&]() -> Status {
    ApiResult<nlohmann::json> got = client_.Get(ref_.ObjectPath());
    if (got.ok()) {
      set_resource_version(VersionOf(*got));
      on_change(*got);
      return Status::Ok();
    }
    if (got.http_status() == 404) {
      // Absent: watch from "now"; its creation arrives as ADDED.
      set_resource_version("");
      on_change(std::nullopt);
      return Status::Ok();
    }
    return got.status();
  };
  source.on_event = [&](const std::string& type, const nlohmann::json& object) {
    if (type == "DELETED") {
      on_change(std::nullopt);
    } else {
      on_change(object);
    }
  };
  Loop(stop, source);
}

CollectionWatcher::CollectionWatcher(const Client& client, std::string collection_path,
                                     std::string label_selector, WatcherOptions options)
    : WatchLoop(client, options),
      path_(std::move(collection_path)),
      selector_(std::move(label_selector)) {}

void CollectionWatcher::Run(StopSignal& stop, const OnList& on_list, const OnEvent& on_event) {
  const std::string selector =
      selector_.empty() ? "" : "labelSelector=" + EscapeQueryValue(selector_);
  Source source;
  source.subject = "collection=" + path_;
  source.list_failed_event = "k8s_list_failed";
  source.watch_path = path_ + "?watch=1&allowWatchBookmarks=true&timeoutSeconds=" +
                      std::to_string(options_.timeout_seconds);
  if (!selector.empty()) source.watch_path += "&" + selector;
  source.list = [&]() -> Status {
    ApiResult<nlohmann::json> got = client_.Get(path_ + (selector.empty() ? "" : "?" + selector));
    if (!got.ok()) return got.status();
    if (!got->is_object()) return Status(ErrorCode::kInvalidInput, "not an object");
    set_resource_version(VersionOf(*got));
    const std::vector<nlohmann::json> items = ItemsOf(std::move(*got));
    on_list(items);
    synced_ = true;
    return Status::Ok();
  };
  source.on_event = on_event;
  Loop(stop, source);
}

}  // namespace gpulet::k8s
