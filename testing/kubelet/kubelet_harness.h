// A stand-in for the kubelet side of the device plugin API (v1beta1), for integration tests and
// for users checking a node (`gpulet-kubelet-harness`). It reproduces the kubelet behaviours a
// plugin must survive:
//
// - Registration is served on <dir>/kubelet.sock. Register validates the version ("v1beta1"), the
//   resource name (an extended resource name, "<domain>/<name>") and the endpoint (a socket file
//   name inside <dir>), then **dials the plugin and calls GetDevicePluginOptions before replying**.
//   A plugin that cannot answer while its own Register is outstanding gets a Register error after
//   `dial_timeout` (the harness never hangs).
// - After a successful Register it opens ONE ListAndWatch stream per resource and treats every
//   message as the complete device list. When the stream ends, every device of the resource is
//   marked Unhealthy and the endpoint is stopped: Allocate and GetPreferredAllocation are refused
//   (errEndpointStopped); after `removal_grace` (the kubelet's 5 minutes) the resource's devices
//   are removed. Re-registering a resource replaces its endpoint; what happens to the old stream
//   depends on HarnessOptions::client_key (by default, as kubelets that key clients by resource
//   name: the old stream's later end disconnects the new client).
// - Restart() simulates a kubelet restart as the real kubelet's happens (checked against kubelet
//   1.37 by tests/cluster/kubelet_differential_test.sh): the process ends, so every stream ends
//   first (the plugin sees its ListAndWatch end, not kubelet.sock go); for `downtime` (the real
//   one is down about 2.5 s) kubelet.sock stays and no Register is answered; then the new kubelet
//   deletes every socket file in <dir> (and nothing else), recreates kubelet.sock and serves again.
// - A pod-resources v1 PodResourcesLister is served on a second socket; List returns what the test
//   set with SetPodResources.
//
// Thread-safety: every method may be called from any thread. State lives under one mutex; waits
// use one condition variable (no sleeping loops).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "podresources_v1.grpc.pb.h"

namespace grpc {
class Server;
class Channel;
class ClientContext;
}  // namespace grpc

namespace gpulet::testing {

using Clock = std::chrono::steady_clock;

inline constexpr char kHealthy[] = "Healthy";
inline constexpr char kUnhealthy[] = "Unhealthy";

struct HarnessOptions {
  // Pod-resources socket; empty means <dir>/pod-resources/kubelet.sock (a subdirectory, so a
  // simulated restart, which deletes the sockets directly in <dir>, leaves it alone — as on a real
  // node, where it lives in /var/lib/kubelet/pod-resources/).
  std::string pod_resources_socket;
  // Deadline of the dial-back GetDevicePluginOptions call made inside Register.
  std::chrono::milliseconds dial_timeout{5000};
  // How long a resource whose stream ended keeps its (Unhealthy) devices. The kubelet uses 5 min.
  std::chrono::milliseconds removal_grace{std::chrono::minutes(5)};
  // Deadline for the calls the harness makes on behalf of tests (Allocate, …).
  std::chrono::milliseconds rpc_timeout{10000};
  // Which client an ended ListAndWatch stream disconnects once its resource has registered again
  // (pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go, runClient):
  enum class ClientKey {
    // runClient looks the client up by resource name (getClient(name)): an OLDER stream that
    // ends after a re-registration disconnects the NEW client: its stream is cancelled, its
    // devices turn Unhealthy and Allocate is refused. A new Register does not end the old stream.
    kResourceName,
    // Only the client whose stream ended is disconnected; a new Register ends the old stream.
    kSocketPath,
  };
  ClientKey client_key = ClientKey::kResourceName;
  // The pod-resources server's rate limit, a token bucket over every call: past it a call gets
  // RESOURCE_EXHAUSTED "rejected by rate limit" (pkg/kubelet/apis/podresources/grpc/
  // ratelimit.go, DefaultQPS 100, DefaultBurstTokens 10). qps <= 0 turns it off.
  double pod_resources_qps = 100;
  int pod_resources_burst = 10;
  // How long after a stream ends its end is handled (the kubelet's goroutine getting to it):
  // lets a test put an old stream's end after the plugin's next Register.
  std::chrono::milliseconds disconnect_delay{0};
};

struct HarnessDevice {
  std::string id;
  std::string health;  // as sent: "Healthy" / "Unhealthy" (or anything the plugin sent)
  std::vector<int64_t> numa_nodes;
  bool healthy() const { return health == kHealthy; }
};

// What the harness knows about one resource name.
struct ResourceState {
  std::string name;
  std::string endpoint;       // socket file name in the directory
  bool registered = false;    // a Register succeeded since the last (simulated) restart
  bool streaming = false;     // its ListAndWatch stream is open
  bool stream_ended = false;  // the stream ended while registered (devices marked Unhealthy)
  bool removed = false;       // removal_grace passed after the stream ended
  // Disconnects of this resource's current client caused by the end of an older stream
  // (ClientKey::kResourceName).
  int disconnects = 0;
  int registrations = 0;      // successful Registers, across restarts
  int rejected = 0;           // failed Registers, across restarts
  uint64_t updates = 0;       // ListAndWatch messages received on the current stream
  v1beta1::DevicePluginOptions options;  // from the dial-back GetDevicePluginOptions
  std::vector<HarnessDevice> devices;    // the latest complete list
  std::string last_error;                // why the last Register failed / how the stream ended

  size_t HealthyCount() const;
};

// One line of history, for watchers (the binary prints these).
struct HarnessEvent {
  enum class Kind { kRegistered, kRejected, kDevices, kStreamEnded, kRemoved, kRestarted };
  uint64_t seq = 0;
  Kind kind = Kind::kRegistered;
  std::string resource;
  std::string detail;                  // endpoint, error text, …
  std::vector<HarnessDevice> devices;  // kDevices and kStreamEnded
};
const char* HarnessEventKindName(HarnessEvent::Kind kind);  // "registered", "devices", …
// One line: "event=devices resource=nvidia.com/gpu total=2 healthy=1
// devices=GPU-a:Healthy:numa=0,GPU-b:Unhealthy:numa=1".
std::string FormatEvent(const HarnessEvent& event);

// One container's devices in the pod-resources List answer. An empty `resource` lists the
// container with no devices (the kubelet lists every container of every pod it knows, devices or
// not); a terminated pod stays listed until the kubelet forgets it, so the same device ID may
// appear under a dead and a live container.
// `claims`: devices Dynamic Resource Allocation gave the container, listed in its
// dynamic_resources (one DynamicResource per claim, one ClaimResource per device), as the kubelet
// does for prepared claims (pkg/kubelet/apis/podresources/server_v1.go with the DRA manager's
// GetContainerClaimInfos).
struct ClaimDevice {
  std::string claim_name;
  std::string claim_namespace;
  std::string driver;
  std::string pool;
  std::string device;
  std::vector<std::string> cdi_devices;  // "vendor/class=name"
  std::optional<std::string> share_id;   // consumable capacity
};
struct PodAssignment {
  std::string namespace_name;
  std::string pod;
  std::string container;
  std::string resource;
  std::vector<std::string> device_ids;
  std::vector<ClaimDevice> claims;
};

class KubeletHarness {
 public:
  explicit KubeletHarness(HarnessOptions options = {});
  ~KubeletHarness();  // Stop()
  KubeletHarness(const KubeletHarness&) = delete;
  KubeletHarness& operator=(const KubeletHarness&) = delete;

  // Serves Registration on <dir>/kubelet.sock and pod-resources on its socket. kNotFound when
  // `dir` does not exist, kUnavailable when a server cannot start, kUsage when already serving.
  Status Start(const std::string& dir);
  // Stops serving, ends every stream, removes the two sockets it created. Idempotent.
  void Stop();
  // Simulated kubelet restart (see above). Registrations must be made again; RegistrationCount
  // keeps counting.
  Status Restart(std::chrono::milliseconds downtime = std::chrono::milliseconds(0));

  const std::string& dir() const { return dir_; }
  std::string kubelet_socket() const;
  std::string pod_resources_socket() const;

  // Waits until `resource` is registered (returns at once when it already is; to wait for a
  // re-registration, use WaitFor on `registrations`).
  Status WaitForRegistration(const std::string& resource, std::chrono::milliseconds timeout);
  // Waits until pred(state) holds for `resource` (pred sees a default state with only `name` set
  // while the resource is unknown). kUnavailable on timeout, naming the last state.
  Status WaitFor(const std::string& resource, const std::function<bool(const ResourceState&)>& pred,
                 std::chrono::milliseconds timeout);

  std::vector<HarnessDevice> Devices(const std::string& resource) const;
  std::optional<ResourceState> State(const std::string& resource) const;
  int RegistrationCount(const std::string& resource) const;
  std::vector<std::string> Resources() const;

  // Calls on the registered plugin of `resource` (kNotFound when not registered; kUnavailable
  // carrying the gRPC error otherwise). One container request per call, as the kubelet sends.
  Result<std::vector<std::string>> GetPreferredAllocation(
      const std::string& resource, const std::vector<std::string>& available,
      const std::vector<std::string>& must_include, int size);
  Result<v1beta1::ContainerAllocateResponse> Allocate(const std::string& resource,
                                                      const std::vector<std::string>& ids);
  Result<v1beta1::DevicePluginOptions> GetDevicePluginOptions(const std::string& resource);
  Status PreStartContainer(const std::string& resource, const std::vector<std::string>& ids);

  // Admits one container asking for `needed` devices of `resource` the way the kubelet's device
  // manager does (pkg/kubelet/cm/devicemanager/manager.go, devicesToAllocate, with no topology
  // hint): devices of the pod's finished ordinary init containers are reused first and become
  // mustInclude; available = healthy devices not allocated to any container; GetPreferredAllocation
  // is called only when the plugin registered GetPreferredAllocationAvailable, with available ∪
  // reused, and its answer is intersected with what may be used; an error from it fails admission;
  // the rest is filled from available in ID order; then Allocate. The devices stay allocated to
  // (pod_uid, container) until ReleasePod. An ordinary init container's devices are offered for
  // reuse to the pod's later containers; a restartable one (sidecar) keeps them.
  struct ContainerAdmission {
    std::string pod_uid;
    std::string container;
    enum class Kind { kApp, kInit, kSidecar } kind = Kind::kApp;
  };
  struct Admitted {
    std::vector<std::string> ids;
    bool preferred_called = false;
    v1beta1::ContainerAllocateResponse response;
  };
  Result<Admitted> Admit(const std::string& resource, const ContainerAdmission& container,
                         int needed);
  void ReleasePod(const std::string& pod_uid);

  void SetPodResources(std::vector<PodAssignment> assignments);
  // After the next Restart(), the first `lists` List (and Get) calls answer `partial` instead of
  // the full set: a kubelet that has not re-admitted every running pod yet answers an empty or
  // partial list (its pod manager fills up as pods are re-admitted).
  void SetPodResourcesAfterRestart(std::vector<PodAssignment> partial, int lists);
  // Pod-resources calls answered so far, and refused by the rate limit.
  int pod_resources_calls() const;
  int pod_resources_rate_limited() const;

  // Returns the first event with seq > `after`, waiting up to `timeout`; nullopt on timeout, or
  // at once after Stop() when there is none. The newest 100000 events are kept.
  std::optional<HarnessEvent> NextEvent(uint64_t after, std::chrono::milliseconds timeout) const;

 private:
  struct Resource;
  class RegistrationService;
  class PodResourcesService;

  Status StartServing();
  void StopServing();
  void StopStreams(bool forget_registrations);
  grpc::Status HandleRegister(const v1beta1::RegisterRequest& request);
  void StreamLoop(std::string name, uint64_t generation,
                  std::shared_ptr<v1beta1::DevicePlugin::Stub> stub,
                  std::shared_ptr<grpc::ClientContext> context);
  void PushEvent(HarnessEvent::Kind kind, const std::string& resource, std::string detail,
                 std::vector<HarnessDevice> devices = {});  // mu_ held
  Result<std::shared_ptr<v1beta1::DevicePlugin::Stub>> StubFor(const std::string& resource) const;
  // The answer of List (mu_ not held); counts a List against a partial answer after restart.
  v1::ListPodResourcesResponse PodResourcesResponse();
  // One token of the rate limit: false when the call must be refused (mu_ not held).
  bool TakePodResourcesToken();

  const HarnessOptions options_;
  std::string dir_;
  std::string pod_socket_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool serving_ = false;
  bool stopping_ = false;
  bool down_ = false;  // inside Restart's downtime: Register answers UNAVAILABLE
  std::map<std::string, std::unique_ptr<Resource>> resources_;
  std::deque<HarnessEvent> events_;
  uint64_t next_seq_ = 1;
  std::vector<PodAssignment> pod_assignments_;
  // Admit's bookkeeping: resource → (pod uid, container) → device IDs; pod uid → resource →
  // devices its ordinary init containers left for reuse.
  std::map<std::string, std::map<std::pair<std::string, std::string>, std::vector<std::string>>>
      allocated_;
  std::map<std::string, std::map<std::string, std::vector<std::string>>> reusable_;
  std::vector<PodAssignment> partial_after_restart_;
  int partial_lists_after_restart_ = 0;  // set by SetPodResourcesAfterRestart
  int partial_lists_left_ = 0;           // armed by Restart()
  double tokens_ = 0;
  Clock::time_point tokens_at_{};
  int pod_resources_calls_ = 0;
  int pod_resources_rate_limited_ = 0;
  // Streams no longer tracked by a resource (replaced or disconnected): cancelled and joined by
  // StopStreams.
  struct RetiredStream {
    std::shared_ptr<grpc::ClientContext> context;
    std::thread thread;
  };
  std::vector<RetiredStream> retired_streams_;

  // Server objects are created by Start/Restart and destroyed by Stop/Restart only; serve_mu_
  // serialises those.
  std::mutex serve_mu_;
  std::unique_ptr<RegistrationService> registration_service_;
  std::unique_ptr<PodResourcesService> pod_service_;
  std::unique_ptr<grpc::Server> registration_server_;
  std::unique_ptr<grpc::Server> pod_server_;
};

}  // namespace gpulet::testing
