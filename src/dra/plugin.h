// The kubelet side of gpulet's DRA driver (`gpulet dra`): registration with the kubelet's plugin
// watcher, the DRAPlugin service (v1 and v1beta1), the device health stream (DRAResourceHealth v1
// and v1alpha1) and the claim bookkeeping around a Preparer (preparer.h).
//
// Sockets (../shared/references/dra.md 1.4), for driver gpu.gpulet.io:
//   <registry_dir>/gpu.gpulet.io-reg.sock                 registration (GetInfo, NotifyRegistrationStatus)
//   <plugins_dir>/gpu.gpulet.io/dra.sock                  DRAPlugin v1 + v1beta1,
//                                                          DRAResourceHealth v1 + v1alpha1
// With an instance ID (the pod UID, for a rolling update, kubelet 1.33+) the names are
// <driver>-<instance>-reg.sock and dra-<instance>.sock, so two instances serve side by side; a
// registration path longer than the 107 bytes a Unix socket allows falls back to
// <driver>-<fnv64(instance)>-reg.sock. Both instances share one state directory on disk (default
// <plugins_dir>/gpu.gpulet.io): each Prepare/Unprepare call holds an exclusive flock on
// <state_dir>/serialize.lock and reads and writes the checkpoint (checkpoint.h) under it, so the
// kubelet may prepare a claim through one instance and unprepare it through the other.
//
// NodePrepareResources, per claim of the batch (the kubelet sends namespace, name and UID only):
//   already prepared with this UID → the same devices again (idempotent, no API call);
//   GET the claim → it must have this UID (not replaced), status.allocation, an allocation for this
//   node (its nodeSelector names this node when it names any; this driver's results are in the
//   pool named after the node), a consumer in status.reservedFor, and no device that another
//   prepared claim holds (a whole GPU also holds its MIG devices and memory shares; two shares of
//   one device are fine when their shareIDs differ; admin access is never a conflict);
//   call the Preparer (all-or-nothing), then one checkpoint write for the whole batch (when it
//   fails, the batch's new claims are unprepared again), then status.devices is written by a
//   worker thread (best effort; needs resourceclaims/status patch). Every failure is that
//   claim's `error`; the batch goes on.
// NodeUnprepareResources works from the checkpoint alone (the claim may be gone); every requested
// claim gets an entry. A claim without an entry (never prepared here, or a Prepare killed before
// its outcome was written) goes to Preparer::Unprepare with an empty record: the Preparer removes
// what the claim's fixed names hold and succeeds when nothing is left.
// A corrupted or foreign checkpoint (LoadCheckpoint) is moved aside and rebuilt from the API server:
// every claim allocated to this node (this driver's devices in its pool) and reserved is prepared
// again (Preparer::Prepare is idempotent). While the API server cannot be reached the rebuild is
// retried at every call, and an Unprepare of an unknown claim is answered with an error (the
// kubelet retries) instead of a success that could leak devices.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "dra/checkpoint.h"
#include "dra/claim.h"
#include "dra/preparer.h"

namespace grpc {
class Server;
}

namespace gpulet::k8s {
class Client;
}

namespace gpulet::dra {

inline constexpr char kDefaultRegistryDir[] = "/var/lib/kubelet/plugins_registry";
inline constexpr char kDefaultPluginsDir[] = "/var/lib/kubelet/plugins";
// The services GetInfo advertises (dra.md 1.1: these are not the gRPC service names).
inline constexpr char kServiceV1[] = "v1.DRAPlugin";
inline constexpr char kServiceV1beta1[] = "v1beta1.DRAPlugin";
// The kubelet 1.37 prefers v1 and keeps v1alpha1 until 1.40; kubelets 1.31-1.36 know v1alpha1 only.
inline constexpr char kServiceHealthV1[] = "v1.DRAResourceHealth";
inline constexpr char kServiceHealthV1alpha1[] = "v1alpha1.DRAResourceHealth";

struct PluginOptions {
  std::string node_name;  // required: the pool name and the nodeSelector this node matches
  std::string registry_dir = kDefaultRegistryDir;
  std::string plugins_dir = kDefaultPluginsDir;
  std::string state_dir;  // empty: <plugins_dir>/gpu.gpulet.io
  // The pod UID for a rolling update ([A-Za-z0-9-], at most 64); empty: the plain socket names.
  std::string instance;
  std::string boot_id_path = "/proc/sys/kernel/random/boot_id";
  bool write_device_status = true;  // status.devices after a Prepare
  bool serve_health = true;         // advertise and serve DRAResourceHealth (v1 and v1alpha1)
  // The health stream sends the complete list again after this long without a change: the kubelet
  // reads a device not heard of for its timeout (30 s unless the report names one) as Unknown.
  std::chrono::milliseconds health_resend{10000};
};

// One device's health for the DRAResourceHealth stream.
struct DeviceHealthReport {
  enum class Health { kUnknown, kHealthy, kUnhealthy };
  std::string device;  // a device name in this node's pool
  Health health = Health::kUnknown;
  std::string message;          // at most 1024 characters are sent
  int64_t timeout_seconds = 0;  // 0: the kubelet's default
};

// One claim's answer to NodePrepareResources.
struct ClaimPrepareOutcome {
  std::vector<CheckpointDevice> devices;
  std::string error;  // empty: prepared
};

class DraPlugin {
 public:
  // `client` and `preparer` must outlive the plugin; `client` may be null (no API server: every
  // Prepare that needs one fails with a clear error).
  DraPlugin(PluginOptions options, const k8s::Client* client, Preparer* preparer);
  ~DraPlugin();
  DraPlugin(const DraPlugin&) = delete;
  DraPlugin& operator=(const DraPlugin&) = delete;

  // Creates the directories, reads the boot ID, recovers the checkpoint (rebuilding it when
  // corrupted or foreign), then serves the DRA socket and, last, the registration socket (the
  // kubelet's watcher sees it only when everything behind it is ready).
  Status Start();
  // Stops serving and removes this instance's sockets (only if they are still ours).
  void Stop();

  // The bookkeeping itself, without gRPC (the services call these; tests and benchmarks may too).
  std::map<std::string, ClaimPrepareOutcome> Prepare(const std::vector<ClaimRef>& claims);
  std::map<std::string, std::string> Unprepare(const std::vector<ClaimRef>& claims);

  // Replaces the complete device health list sent on the health streams.
  void SetDeviceHealth(std::vector<DeviceHealthReport> devices);

  std::string registration_socket() const { return registration_socket_; }
  std::string dra_socket() const { return dra_socket_; }
  std::string checkpoint_path() const { return state_dir_ + "/checkpoint.json"; }
  // The last NotifyRegistrationStatus: 0 none yet, 1 registered, -1 refused.
  int registration_state() const { return registration_state_.load(); }
  // Whether a corrupted/foreign checkpoint's rebuild is still waiting for the API server.
  bool rebuild_pending() const { return rebuild_pending_.load(); }

  // For the gRPC services (plugin.cc).
  struct HealthState;
  HealthState& health_state() { return *health_; }
  void OnRegistrationStatus(bool registered, const std::string& error);
  std::vector<std::string> SupportedVersions() const;

 private:
  Result<Checkpoint> LoadLocked();
  Status RebuildLocked(Checkpoint& cp);
  ClaimPrepareOutcome PrepareOne(Checkpoint& cp, const ClaimRef& ref, nlohmann::json* claim_object);
  void WriteDeviceStatus(const nlohmann::json& claim, const std::vector<CheckpointDevice>& devices);
  void StatusLoop();

  PluginOptions options_;
  const k8s::Client* client_;
  Preparer* preparer_;
  std::string state_dir_, registration_socket_, dra_socket_, lock_path_;
  std::string boot_id_;
  std::mutex mu_;  // one call at a time in this process (the flock covers other processes)
  std::atomic<bool> rebuild_pending_{false};
  std::atomic<int> registration_state_{0};
  std::atomic<bool> status_warned_{false};
  // status.devices writes, off the kubelet's path (a worker thread, best effort).
  std::mutex status_mu_;
  std::condition_variable status_cv_;
  std::deque<std::pair<nlohmann::json, std::vector<CheckpointDevice>>> status_queue_;
  bool status_stop_ = false;
  std::thread status_thread_;
  std::unique_ptr<HealthState> health_;
  struct Services;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> dra_server_, registration_server_;
  ino_t dra_inode_ = 0, registration_inode_ = 0;
};

}  // namespace gpulet::dra
