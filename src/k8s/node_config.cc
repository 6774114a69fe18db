#include "k8s/node_config.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "config/config.h"

namespace gpulet::k8s {

Result<ConfigChoice> SelectConfig(const std::optional<nlohmann::json>& node,
                                  const std::optional<nlohmann::json>& configmap,
                                  const NodeConfigOptions& o) {
  const std::string cm_name = o.configmap_namespace + "/" + o.configmap_name;
  ConfigChoice choice;
  choice.name = o.default_config;
  if (node && node->contains("metadata") && (*node)["metadata"].contains("labels")) {
    const nlohmann::json& labels = (*node)["metadata"]["labels"];
    if (labels.contains(o.label) && labels[o.label].is_string() &&
        !labels[o.label].get<std::string>().empty()) {
      choice.name = labels[o.label].get<std::string>();
      choice.from_label = true;
    }
  }
  const std::string why =
      choice.from_label ? "label " + o.label + "=" + choice.name + " on node " + o.node_name
                        : "default config of node " + o.node_name + " (no " + o.label + " label)";
  if (!configmap) {
    return Status(ErrorCode::kNotFound, "configmap " + cm_name + " not found (" + why + ")");
  }
  const nlohmann::json data = configmap->value("data", nlohmann::json::object());
  if (!data.is_object() || !data.contains(choice.name) || !data[choice.name].is_string()) {
    std::string available;
    if (data.is_object()) {
      for (auto it = data.begin(); it != data.end(); ++it) {
        available += (available.empty() ? "" : ", ") + it.key();
      }
    }
    return Status(ErrorCode::kNotFound,
                  "configmap " + cm_name + " has no config \"" + choice.name + "\" (" + why +
                      "); available: " + (available.empty() ? "none" : available));
  }
  choice.content = data[choice.name].get<std::string>();
  Result<config::Config> parsed =
      config::ParseConfig(choice.content, "configmap " + cm_name + "[" + choice.name + "]");
  if (!parsed.ok()) return parsed.status();
  return choice;
}

Result<bool> WriteFileIfChanged(const std::string& path, const std::string& content) {
  {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      if (ss.str() == content) return false;
    }
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status(ErrorCode::kUnavailable, "cannot write " + tmp);
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      return Status(ErrorCode::kUnavailable, "cannot write " + tmp);
    }
    off += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Status(ErrorCode::kUnavailable, "cannot rename " + tmp + " to " + path);
  }
  return true;
}

NodeConfigSync::NodeConfigSync(const Client& client, NodeConfigOptions options,
                               WatcherOptions watcher)
    : client_(client), options_(std::move(options)) {
  node_watcher_ = std::make_unique<ObjectWatcher>(client_, NodeRef(options_.node_name), watcher);
  configmap_watcher_ = std::make_unique<ObjectWatcher>(
      client_, ConfigMapRef(options_.configmap_namespace, options_.configmap_name), watcher);
}

Result<ConfigChoice> NodeConfigSync::SyncOnce() {
  ApiResult<nlohmann::json> node = client_.Get(NodeRef(options_.node_name).ObjectPath());
  if (!node.ok() && node.http_status() != 404) return node.status();
  ApiResult<nlohmann::json> cm =
      client_.Get(ConfigMapRef(options_.configmap_namespace, options_.configmap_name).ObjectPath());
  if (!cm.ok() && cm.http_status() != 404) return cm.status();
  Result<ConfigChoice> choice = SelectConfig(node.ok() ? std::optional(*node) : std::nullopt,
                                             cm.ok() ? std::optional(*cm) : std::nullopt, options_);
  if (!choice.ok()) return choice;
  Result<bool> wrote = WriteFileIfChanged(options_.output_path, choice->content);
  if (!wrote.ok()) return wrote.status();
  if (*wrote) ++writes_;
  spdlog::info("event=config_selected node={} config={} from_label={} file={} written={}",
               options_.node_name, choice->name, choice->from_label, options_.output_path, *wrote);
  return choice;
}

void NodeConfigSync::Apply() {
  if (!node_seen_ || !configmap_seen_) return;  // both first reads done: no flapping at start
  Result<ConfigChoice> choice = SelectConfig(node_, configmap_, options_);
  if (!choice.ok()) {
    const std::string key = "!" + choice.status().message();
    if (key != last_choice_) {
      ++rejected_;
      spdlog::error("event=config_rejected node={} file={} action=keep_current error=\"{}\"",
                    options_.node_name, options_.output_path, choice.status().message());
      last_choice_ = key;
    }
    return;
  }
  last_choice_ = choice->name + '\0' + choice->content;
  Result<bool> wrote = WriteFileIfChanged(options_.output_path, choice->content);
  if (!wrote.ok()) {
    spdlog::error("event=config_write_failed file={} error=\"{}\"", options_.output_path,
                  wrote.status().message());
    return;
  }
  if (*wrote) {
    ++writes_;
    spdlog::info("event=config_switched node={} config={} from_label={} file={}",
                 options_.node_name, choice->name, choice->from_label, options_.output_path);
  }
}

void NodeConfigSync::Run(StopSignal& stop) {
  std::thread cm_thread([&] {
    configmap_watcher_->Run(stop, [&](const std::optional<nlohmann::json>& obj) {
      std::lock_guard<std::mutex> lock(mu_);
      configmap_ = obj;
      configmap_seen_ = true;
      Apply();
    });
  });
  node_watcher_->Run(stop, [&](const std::optional<nlohmann::json>& obj) {
    std::lock_guard<std::mutex> lock(mu_);
    node_ = obj;
    node_seen_ = true;
    Apply();
  });
  cm_thread.join();
}

}  // namespace gpulet::k8s
