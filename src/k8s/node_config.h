// Per-node config selection (the NVIDIA convention): one ConfigMap holds several named configs in
// the device plugin v1 format; the node's label `nvidia.com/device-plugin.config=<name>` picks
// one, nodes without the label get the default name. NodeConfigSync follows both objects through
// the API and writes the chosen config to a local file, atomically (write + fsync + rename) and
// only when its bytes change, so `gpulet node --config FILE` reloads it and keeps the resources
// whose definition did not change.
//
// A choice that cannot be honoured (the label names a config the ConfigMap lacks, the config does
// not parse, the ConfigMap is gone) is logged with the reason and the file is left as it is: a
// node never switches to nothing or to an invalid config.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/status.h"
#include "k8s/client.h"
#include "k8s/watch.h"

namespace gpulet::k8s {

inline constexpr const char* kConfigLabel = "nvidia.com/device-plugin.config";

struct NodeConfigOptions {
  std::string node_name;
  std::string configmap_namespace;
  std::string configmap_name;
  std::string label = kConfigLabel;
  std::string default_config = "default";
  std::string output_path;
};

struct ConfigChoice {
  std::string name;     // the ConfigMap key
  std::string content;  // its value, a v1 config that parsed
  bool from_label = false;
};

// Picks and validates the config for `node` from `configmap` (either may be absent). Errors name
// the node, label and ConfigMap: kNotFound (no such key, ConfigMap absent) or kInvalidInput (the
// config does not parse: "configmap NS/NAME[KEY]:LINE: field: problem").
Result<ConfigChoice> SelectConfig(const std::optional<nlohmann::json>& node,
                                  const std::optional<nlohmann::json>& configmap,
                                  const NodeConfigOptions& options);

// Writes `content` to `path` atomically unless the file already holds exactly it. Returns whether
// it wrote.
Result<bool> WriteFileIfChanged(const std::string& path, const std::string& content);

class NodeConfigSync {
 public:
  NodeConfigSync(const Client& client, NodeConfigOptions options, WatcherOptions watcher = {});

  // GETs the node and the ConfigMap once, selects and writes. For an init container.
  Result<ConfigChoice> SyncOnce();

  // Watches both until stop, re-selecting and writing on every change.
  void Run(StopSignal& stop);

  uint64_t writes() const { return writes_.load(); }
  uint64_t rejected() const { return rejected_.load(); }  // choices that could not be honoured
  const ObjectWatcher& node_watcher() const { return *node_watcher_; }
  const ObjectWatcher& configmap_watcher() const { return *configmap_watcher_; }

 private:
  void Apply();  // caller holds mu_

  const Client& client_;
  NodeConfigOptions options_;
  std::unique_ptr<ObjectWatcher> node_watcher_;
  std::unique_ptr<ObjectWatcher> configmap_watcher_;
  std::mutex mu_;
  std::optional<nlohmann::json> node_;
  std::optional<nlohmann::json> configmap_;
  bool node_seen_ = false, configmap_seen_ = false;
  std::string last_choice_;  // "name\0content" last applied or rejected, to log once per change
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> rejected_{0};
};

}  // namespace gpulet::k8s
