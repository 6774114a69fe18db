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

ObjectWatcher::ObjectWatcher(const Client& client, ObjectRef ref, WatcherOptions options)
    : client_(client), ref_(std::move(ref)), options_(options) {}

std::string ObjectWatcher::resource_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resource_version_;
}

namespace {
std::string VersionOf(const nlohmann::json& object) {
  if (!object.is_object() || !object.contains("metadata")) return "";
  return object["metadata"].value("resourceVersion", "");
}
}  // namespace

void ObjectWatcher::Run(StopSignal& stop, const OnChange& on_change) {
  bool need_list = true;
  std::chrono::milliseconds backoff = options_.initial_backoff;
  const std::string what = ref_.Describe();
  auto set_rv = [this](const std::string& rv) {
    std::lock_guard<std::mutex> lock(mu_);
    resource_version_ = rv;
  };
  auto fail_wait = [&]() {
    ++stats_.reconnects;
    const bool stopped = stop.WaitFor(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
    return stopped;
  };

  while (!stop.stopped()) {
    if (need_list) {
      ++stats_.lists;
      ApiResult<nlohmann::json> got = client_.Get(ref_.ObjectPath());
      if (got.ok()) {
        set_rv(VersionOf(*got));
        on_change(*got);
      } else if (got.http_status() == 404) {
        // Absent: watch from "now"; its creation arrives as ADDED.
        set_rv("");
        on_change(std::nullopt);
      } else {
        spdlog::warn("event=k8s_get_failed object={} error=\"{}\"", what, got.status().message());
        if (fail_wait()) return;
        continue;
      }
      need_list = false;
    }

    std::string query = "?watch=1&allowWatchBookmarks=true&fieldSelector=" +
                        EscapeQueryValue("metadata.name=" + ref_.name) +
                        "&timeoutSeconds=" + std::to_string(options_.timeout_seconds);
    const std::string rv = resource_version();
    if (!rv.empty()) query += "&resourceVersion=" + EscapeQueryValue(rv);
    ++stats_.watches;
    bool got_event = false;
    WatchResult r = client_.Watch(
        ref_.collection_path + query,
        [&](const WatchEvent& ev) {
          got_event = true;
          const std::string v = VersionOf(ev.object);
          if (!v.empty()) set_rv(v);
          if (ev.type == "ADDED" || ev.type == "MODIFIED") {
            on_change(ev.object);
          } else if (ev.type == "DELETED") {
            on_change(std::nullopt);
          }
          return !stop.stopped();
        },
        stop.flag());
    if (got_event) backoff = options_.initial_backoff;
    switch (r.end) {
      case WatchEnd::kStopped:
        return;
      case WatchEnd::kClosed:
        spdlog::debug("event=k8s_watch_closed object={} resource_version={}", what,
                      resource_version());
        break;
      case WatchEnd::kGone:
        ++stats_.gone;
        spdlog::info("event=k8s_watch_gone object={} resource_version={} action=relist", what,
                     resource_version());
        need_list = true;
        break;
      case WatchEnd::kBroken:
      case WatchEnd::kFailed:
        spdlog::warn(
            "event=k8s_watch_broken object={} resource_version={} retry_ms={} error=\"{}\"", what,
            resource_version(), backoff.count(), r.error.message());
        if (fail_wait()) return;
        break;
    }
  }
}

}  // namespace gpulet::k8s
