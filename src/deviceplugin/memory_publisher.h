// Publishes this node's memory pool (sharing.memory) for `gpulet extender`: per GPU, the units
// that are free, in the ConfigMap `gpulet-memory-<node>` of gpulet's namespace (the contract is
// in docs/sharing.md, "Memory pool", and fixed between the node agent and the extender):
//
//   data["memory.json"] = {"version":1, "node", "generation", "resource", "unitBytes",
//                          "heartbeatSeconds", "gpus":[{"uuid","index","model","numaNode",
//                          "healthy","totalUnits","freeUnits"}],
//                          "pods":[{"namespace","name","container","gpu","units"}]}
//
// Held units are those the kubelet's pod-resources List names (with their pod and container),
// plus those an Allocate handed out that the kubelet does not list yet (the kubelet records a
// container's devices right after its Allocate returns). A unit is free again only when its
// absence is confirmed (DeviceAbsence, memory_limits_janitor.h): missing from `absence.lists`
// consecutive Lists of the same kubelet spanning `absence.span` (for an Allocate not listed yet,
// Lists begun allocate_settle after it). One List is never the whole truth: right after a kubelet
// restart it can be empty or partial, and publishing held units as free would let the extender
// book them twice. While the kubelet cannot be asked, nothing is released.
//
// Publication: created with POST, then changed with a merge PATCH (recreated if deleted). It is
// republished when the document changes, at most once per min_interval, and at least every
// heartbeat even without change, so the extender can tell a dead agent from an idle one.
// `generation` increases on every publication, also across restarts: it starts above both the
// existing object's generation and the wall clock in milliseconds.
//
// Threads: OnAllocate runs on gRPC threads, SetPool on the plugin manager's, Tick on the
// publisher's own (Start) or the caller's (tests); one mutex guards the state.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "deviceplugin/allocate.h"
#include "deviceplugin/memory_limits_janitor.h"
#include "gpu/health.h"
#include "gpu/inventory.h"
#include "k8s/client.h"
#include "sharing/plan.h"

namespace gpulet::deviceplugin {

struct MemoryPublisherOptions {
  std::string node_name;
  std::string namespace_name = "gpulet-system";
  std::chrono::milliseconds min_interval{1000};   // at most one publication per interval
  std::chrono::seconds heartbeat{30};             // at least one publication per heartbeat
  std::chrono::milliseconds list_interval{5000};  // pod-resources List this often
  // An allocated unit counts until a List begun this long after the Allocate omits it.
  std::chrono::milliseconds allocate_settle{2000};
  // How absence from the kubelet's Lists is confirmed before a unit is free again.
  AbsenceOptions absence;
  // Called with every document published (on the publisher's thread); may be empty.
  std::function<void(const nlohmann::json& document)> on_publish;
};

// "gpulet-memory-<node>" and its API path in `namespace_name`.
std::string MemoryObjectName(const std::string& node_name);
std::string MemoryObjectPath(const std::string& namespace_name, const std::string& node_name);

// The labels the object carries (app.kubernetes.io/name, gpulet.io/memory-pool, gpulet.io/node).
nlohmann::json MemoryObjectLabels(const std::string& node_name);

// Who holds a unit: a container the kubelet lists, or an Allocate not listed yet (empty names).
using UnitHolders = std::map<std::string, PodContainer>;

// The memory.json document (pure). `health` may be null (all healthy).
nlohmann::json MemoryDocument(const sharing::Resource& pool, const gpu::Inventory& inventory,
                              const gpu::HealthSnapshot* health, const UnitHolders& held,
                              const std::string& node_name, uint64_t generation,
                              std::chrono::seconds heartbeat);

// Lists device ID → holder (pod-resources List), e.g. ListPodDevices on the kubelet's socket.
using PodDeviceLister = std::function<Result<PodDeviceList>()>;

class MemoryPoolPublisher final : public AllocationListener {
 public:
  // `health` may be null. `client` and `clock` must outlive the publisher.
  MemoryPoolPublisher(MemoryPublisherOptions options, const k8s::Client& client, Clock& clock,
                      PodDeviceLister lister, const gpu::HealthBoard* health = nullptr);
  ~MemoryPoolPublisher() override;  // Stop()s
  MemoryPoolPublisher(const MemoryPoolPublisher&) = delete;
  MemoryPoolPublisher& operator=(const MemoryPoolPublisher&) = delete;

  // The plan's memory-pool resource (the first kMemory one) on `inventory`; a plan without one
  // publishes nothing.
  void SetPool(const sharing::Plan& plan, std::shared_ptr<const gpu::Inventory> inventory);
  bool has_pool() const;

  void OnAllocate(const sharing::Resource& resource,
                  const std::vector<std::string>& device_ids) override;

  // One cycle: lists the kubelet when due, recounts, and publishes when the document changed (and
  // min_interval passed) or the heartbeat is due. The error of a failed publication (retried on
  // the next cycle).
  Status Tick();

  // Runs Tick every min_interval on a thread, until Stop().
  void Start();
  void Stop();

  uint64_t generation() const;
  size_t publications() const;
  // Waits (real time, bounded) until at least `n` publications succeeded.
  bool WaitForPublications(size_t n, std::chrono::milliseconds timeout) const;

 private:
  Status Publish(const nlohmann::json& document);

  const MemoryPublisherOptions options_;
  const k8s::Client& client_;
  Clock& clock_;
  const PodDeviceLister lister_;
  const gpu::HealthBoard* const health_;

  mutable std::mutex mu_;
  mutable std::condition_variable published_cv_;
  std::optional<sharing::Resource> pool_;
  std::shared_ptr<const gpu::Inventory> inventory_;
  std::map<std::string, PodContainer> listed_;       // pool unit → holder, until confirmed gone
  std::map<std::string, Clock::TimePoint> pending_;  // allocated, not listed yet
  DeviceAbsence absence_;
  bool listed_once_ = false;

  // Tick's thread only (besides the counters read under mu_).
  Clock::TimePoint next_list_{};
  Clock::TimePoint last_publish_{};
  std::string last_content_;   // the document without its generation
  bool exists_known_ = false;  // the object's existence and generation were read
  bool exists_ = false;
  uint64_t generation_ = 0;
  size_t publications_ = 0;
  bool failing_ = false;

  StopSignal stop_;
  std::thread thread_;
};

}  // namespace gpulet::deviceplugin
