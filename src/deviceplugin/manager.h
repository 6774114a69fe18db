// The device plugin's control loop: serves one ResourceServer per planned resource, registers
// each with the kubelet, and keeps that true across kubelet restarts and config reloads.
//
// One thread (Run) owns every server. It wakes on inotify events in the device-plugin directory
// and the config file's directory, on Stop()/RequestReload(), and at least every
// `reconcile_interval`, then reconciles:
// - a server whose socket vanished (a restarting kubelet deletes every socket) is restarted;
// - a server is (re-)registered whenever kubelet.sock is a different file than the one it last
//   registered with (identity = inode + ctime), so a recreated kubelet.sock always triggers
//   registration; failures are retried with backoff, and a missing kubelet is simply waited for.
// - a server whose ListAndWatch stream the kubelet ended, with no stream open since, is
//   registered again: kubelets that key their clients by resource name drop the NEW endpoint
//   when an older stream of the same resource ends after the re-registration
//   (pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go, runClient → getClient(name)).
//   Repeated losses within 10 s of a registration back off.
// - on reload, the loader builds a new setup; only resources whose plan or options changed are
//   restarted, the others keep their server and the kubelet's stream. A failed reload keeps the
//   current setup and logs why. A setup may carry a new inventory (re-discovery after a MIG
//   layout change): new and changed resources are served from it.
// Registration never blocks serving: each server runs on its own gRPC threads, so the kubelet's
// GetDevicePluginOptions dial-back inside Register is answered.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "deviceplugin/allocate.h"
#include "deviceplugin/resource_server.h"
#include "gpu/health.h"
#include "sharing/plan.h"

namespace gpulet::deviceplugin {

struct ServingSetup {
  sharing::Plan plan;
  AllocateOptions allocate;
  // The inventory the plan was built from, when it differs from the one the manager holds (a
  // re-discovery found new GPUs or MIG devices). Servers started from now on use it; servers
  // whose resource did not change keep theirs. Null: keep the current one.
  std::shared_ptr<const gpu::Inventory> inventory;
};

// Re-reads the configuration and builds a new setup (on SIGHUP or a config file change).
using SetupLoader = std::function<Result<ServingSetup>()>;

struct ManagerOptions {
  std::string plugin_dir = "/var/lib/kubelet/device-plugins/";
  std::string kubelet_socket_name = "kubelet.sock";
  std::string config_path;  // watched for changes when set
  std::chrono::milliseconds register_timeout{5000};
  std::chrono::milliseconds reconcile_interval{1000};
  std::chrono::milliseconds max_backoff{5000};
};

class Manager {
 public:
  // Registration retries are timed on `clock` (the loop itself wakes on its descriptors and at
  // least every reconcile_interval).
  Manager(ManagerOptions options, std::shared_ptr<const gpu::Inventory> inventory,
          const gpu::HealthBoard& health, SetupLoader loader, Clock& clock = RealClock());
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // Serves `initial` and runs the control loop until Stop(). Returns an error only when the
  // plugin directory cannot be created or watched at all.
  Status Run(ServingSetup initial);
  // Thread-safe; async-signal-safe (writes to an eventfd).
  void Stop();
  void RequestReload();

 private:
  void Wake();  // async-signal-safe
  struct Entry {
    std::unique_ptr<ResourceServer> server;
    bool registered = false;
    std::string registered_with;  // kubelet.sock identity at registration
    Clock::TimePoint next_attempt{};
    std::chrono::milliseconds backoff{0};
    uint64_t lost_seen = 0;           // server->streams_lost() when last looked at
    Clock::TimePoint registered_at{};
    std::chrono::milliseconds lost_backoff{0};  // between re-registrations after lost streams
  };

  void Apply(ServingSetup setup);
  void Reconcile();
  Status Register(const ResourceServer& server);
  std::string KubeletIdentity() const;  // "" when kubelet.sock is absent
  std::string SocketPath(const sharing::Resource& r) const;

  ManagerOptions options_;
  std::shared_ptr<const gpu::Inventory> inventory_;
  const gpu::HealthBoard& health_;
  SetupLoader loader_;
  Clock& clock_;
  int wake_fd_ = -1;  // eventfd: Stop()/RequestReload() wake the loop
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> reload_requested_{false};
  std::map<std::string, Entry> entries_;  // by resource name; Run's thread only
};

}  // namespace gpulet::deviceplugin
