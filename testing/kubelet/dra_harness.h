// A stand-in for the kubelet's DRA side (pkg/kubelet/cm/dra; ../shared/references/dra.md 1.1, 1.5),
// for tests of a DRA kubelet plugin. It behaves as the kubelet does where a plugin depends on it:
//
// - It watches the plugins_registry directory (inotify, as the plugin watcher's fsnotify) and, for
//   every socket that appears, calls GetInfo, checks what the kubelet checks (type "DRAPlugin"; a
//   driver name that is a DNS subdomain of at most 63 characters; an absolute endpoint of at most
//   108 bytes, inside `kubelet_root` when one is set; a DRAPlugin service it speaks), picks the
//   DRAPlugin service as the kubelet 1.37 does (validateSupportedServices: the first of the
//   plugin's list that it speaks, so the plugin's order decides), answers
//   NotifyRegistrationStatus, and opens the health stream of the newest DRAResourceHealth version
//   both sides know, in the kubelet's order (pickHealthService: v1, then v1alpha1; a harness
//   given only v1alpha1 acts as a kubelet 1.31-1.36).
//   Several registrations of one driver (a rolling update) are kept; calls go to the newest.
// - A socket that disappears deregisters its registration. When a driver has none left, its
//   ResourceSlices are wiped after `wiping_delay` (the kubelet's 30 s) unless it registers again
//   in time; at Start the node's slices are wiped (no driver has registered yet). Wiping is a
//   callback: the tests give it the API server.
// - PreparePod batches all of a pod's claims for one driver into one NodePrepareResources call,
//   retries the claims that failed (gRPC error, missing entry, per-claim error), and remembers
//   what was prepared; a claim already prepared (shared by pods) is not prepared again.
//   UnpreparePod does the same for NodeUnprepareResources.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace gpulet::testing {

struct DraHarnessOptions {
  std::string registry_dir;  // the plugins_registry directory to watch (created if missing)
  std::string kubelet_root;  // when set, endpoints must lie inside it (kubelet 1.37 hardening)
  std::chrono::milliseconds dial_timeout{5000};   // GetInfo and friends
  std::chrono::milliseconds call_timeout{45000};  // the kubelet's defaultClientCallTimeout
  std::chrono::milliseconds wiping_delay{30000};  // defaultWipingDelay
  // The DRAResourceHealth services this kubelet speaks, most recent first
  // (healthServicesSupportedByKubelet of 1.37); only these two are spoken.
  std::vector<std::string> health_services = {"v1.DRAResourceHealth",
                                              "v1alpha1.DRAResourceHealth"};
  // Deletes ResourceSlices: driver "" = every slice of the node (at Start), else that driver's.
  std::function<void(const std::string& driver)> wipe_slices;
};

struct DraDevice {
  std::vector<std::string> request_names;
  std::string pool;
  std::string device;
  std::string share_id;  // v1 only
  std::vector<std::string> cdi_device_ids;
};

struct DraClaimRef {
  std::string namespace_;
  std::string name;
  std::string uid;
  std::string driver;
};

struct DraPrepared {
  std::vector<DraDevice> devices;
  std::string error;  // the last attempt's error; empty when prepared
};

struct DraDeviceHealth {
  std::string pool, device;
  std::string health;  // "Unknown", "Healthy", "Unhealthy"
  std::string message;
  int64_t timeout_seconds = 0;
};

struct DraRegistration {
  std::string socket;    // the registration socket in plugins_registry
  std::string driver;
  std::string endpoint;
  std::string service;   // the DRAPlugin service picked: "v1.DRAPlugin" or "v1beta1.DRAPlugin"
  // The health service picked ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"); empty when
  // the plugin advertises none this kubelet speaks.
  std::string health_service;
};

class DraKubeletHarness {
 public:
  explicit DraKubeletHarness(DraHarnessOptions options);
  ~DraKubeletHarness();  // Stop()
  DraKubeletHarness(const DraKubeletHarness&) = delete;
  DraKubeletHarness& operator=(const DraKubeletHarness&) = delete;

  Status Start();
  void Stop();

  // The driver's newest registration, once it has one.
  std::optional<DraRegistration> Driver(const std::string& driver) const;
  bool WaitForDriver(const std::string& driver, std::chrono::milliseconds timeout) const;
  bool WaitForDriverGone(const std::string& driver, std::chrono::milliseconds timeout) const;
  // Registration errors the harness answered (NotifyRegistrationStatus with an error), in order.
  std::vector<std::string> refused() const;

  // One NodePrepareResources per driver for the pod's claims not yet prepared, each retried up to
  // `attempts` times (`backoff` apart) while it fails. The answer covers every claim.
  std::map<std::string, DraPrepared> PreparePod(const std::vector<DraClaimRef>& claims,
                                                int attempts = 1,
                                                std::chrono::milliseconds backoff =
                                                    std::chrono::milliseconds(100));
  // One NodeUnprepareResources per driver; claims are forgotten when they succeed.
  std::map<std::string, std::string> UnpreparePod(const std::vector<DraClaimRef>& claims,
                                                  int attempts = 1,
                                                  std::chrono::milliseconds backoff =
                                                      std::chrono::milliseconds(100));
  // Calls made to drivers (NodePrepareResources, NodeUnprepareResources), for tests.
  size_t prepare_calls() const;
  size_t unprepare_calls() const;

  // The latest complete list from the driver's health stream (empty before the first message).
  std::vector<DraDeviceHealth> Health(const std::string& driver) const;
  // Waits until `pred` holds for the driver's health list.
  bool WaitForHealth(const std::string& driver,
                     const std::function<bool(const std::vector<DraDeviceHealth>&)>& pred,
                     std::chrono::milliseconds timeout) const;
  // Slice wipes done so far (drivers; "" for the node-wide wipe at Start).
  std::vector<std::string> wipes() const;

 private:
  struct Registration;
  void WatchLoop();
  void OnSocketAdded(const std::string& path);
  void OnSocketRemoved(const std::string& path);
  void HealthLoop(std::shared_ptr<Registration> reg);
  std::shared_ptr<Registration> Newest(const std::string& driver) const;

  DraHarnessOptions options_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool stopping_ = false;
  int inotify_fd_ = -1;
  std::thread watcher_;
  std::map<std::string, std::shared_ptr<Registration>> by_socket_;
  std::map<std::string, uint64_t> generation_;  // per driver, bumped by every (de)registration
  uint64_t sequence_ = 0;
  std::map<std::string, std::vector<DraDeviceHealth>> health_;
  std::vector<std::string> refused_;
  std::vector<std::string> wipes_;
  std::map<std::string, DraPrepared> prepared_;  // by claim UID
  size_t prepare_calls_ = 0, unprepare_calls_ = 0;
  std::vector<std::thread> threads_;  // health streams and delayed wipes
};

}  // namespace gpulet::testing
