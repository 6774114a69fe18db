// The scheduler extender's view of the fleet's GPU memory pools, and the decisions made on it
// (docs/memory-requests.md). Pure: no I/O; time comes from an injected Clock.
//
// Input: the per-node ConfigMaps the node agents publish (contract in docs/memory-requests.md:
// `gpulet-memory-<node>`, data["memory.json"] with per-GPU free units, a generation, the pods the
// kubelet has placed). Output: Filter (which nodes can hold a pod, and why not), Prioritize
// (0..MaxExtenderPriority per node) and Reserve (the units a bound pod will take, held in memory
// until the node's object lists the pod, or until a timeout).
//
// Rules:
// - A node passes only if every container's request of the pod's memory resource fits on one of
//   its GPUs, the containers placed in turn (each on the GPU the policy picks, as the device
//   plugin's preferred allocation does), on free units = published free − reserved; an unhealthy
//   GPU counts as 0 free.
// - A node whose object is missing, malformed, for another resource, or stale (its
//   resourceVersion unchanged for longer than stale_after on OUR monotonic clock; the agent's wall
//   clock is never compared with ours) fails as unresolvable, with the reason.
// - Reserve checks the fit and records the reservation under one lock, so two pods bound back to
//   back never both count the same free units.
// Thread-safe: one shared mutex; Filter and Prioritize take it shared.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace gpulet::extender {

inline constexpr int kMaxExtenderPriority = 10;
inline constexpr const char* kMemoryResourcePrefix = "gpulet.io/gpu-memory-";
inline constexpr const char* kMemoryPoolLabel = "gpulet.io/memory-pool";
inline constexpr const char* kNodeLabel = "gpulet.io/node";
inline constexpr const char* kNodePoolLabel = "gpulet.io/gpu-memory.pool";
inline constexpr const char* kObjectPrefix = "gpulet-memory-";

struct GpuMemory {
  std::string uuid;
  int index = 0;
  std::string model;
  int numa_node = -1;
  bool healthy = true;
  int64_t total_units = 0;
  int64_t free_units = 0;
};

struct PlacedUnits {  // a container's units on a GPU, as the kubelet reported them
  std::string ns, name, container, gpu;
  int64_t units = 0;
};

// data["memory.json"] of a node's object.
struct NodeMemory {
  std::string node;
  int64_t generation = 0;
  std::string resource;
  int64_t unit_bytes = 0;
  int heartbeat_seconds = 30;
  std::vector<GpuMemory> gpus;
  std::vector<PlacedUnits> pods;
};

// Parses memory.json; errors name `where` and the field ("cm/x: memory.json: gpus[1].freeUnits:
// must be an integer between 0 and totalUnits, got 90").
Result<NodeMemory> ParseMemoryJson(const std::string& text, const std::string& where);

struct ContainerUnits {
  std::string name;
  int64_t units = 0;
};

// What a pod asks of a memory resource.
struct PodRequest {
  std::string ns, name, uid;
  std::string resource;                    // "" when the pod asks for no memory resource
  std::vector<ContainerUnits> containers;  // app containers with a non-zero request, in order
  std::vector<ContainerUnits> init_containers;
  std::string key() const { return ns + "/" + name; }
  int64_t total() const;
};

// From a v1.Pod: requests (or, where absent, limits) of resources named gpulet.io/gpu-memory-*.
// A pod asking for two different memory resources, or a quantity that is not a whole number,
// is an error naming the container and field.
Result<PodRequest> ParsePodRequest(const nlohmann::json& pod);
// "20" / 20 → 20; anything but a non-negative whole number → error.
Result<int64_t> ParseUnits(const nlohmann::json& quantity);

enum class Policy { kBestFit, kSpread };
Result<Policy> ParsePolicy(const std::string& name);

struct Assignment {
  std::string container;
  std::string gpu;  // UUID
  int64_t units = 0;
};

struct NodeVerdict {
  bool fits = false;
  bool unresolvable = false;  // preemption cannot help (no/stale/bad object)
  std::string reason;         // when !fits
  std::vector<Assignment> assignments;
  int score = 0;  // 0..kMaxExtenderPriority when fits
};

struct FilterOutcome {
  std::vector<std::string> passed;
  std::map<std::string, std::string> failed;        // capacity: preemption may help
  std::map<std::string, std::string> unresolvable;  // object missing/stale/malformed
};

struct ViewOptions {
  std::string ns = "gpulet-system";  // where the objects live (for reasons only)
  // 0: 3 × the object's heartbeatSeconds.
  Clock::Duration stale_after{0};
  Clock::Duration reservation_timeout = std::chrono::seconds(60);
  Policy policy = Policy::kBestFit;
};

struct ViewStats {
  size_t objects = 0;
  size_t malformed = 0;
  size_t stale = 0;
  size_t reservations = 0;
  int64_t reserved_units = 0;
};

class ClusterView {
 public:
  ClusterView(const Clock& clock, ViewOptions options);

  // A ConfigMap (ADDED/MODIFIED, or from a list). Objects without the node label/name prefix are
  // ignored. Drops the reservations of pods the object lists.
  void UpsertObject(const nlohmann::json& configmap);
  void RemoveObject(const std::string& configmap_name);
  // A full list: objects not in it are removed.
  void ReplaceObjects(const std::vector<nlohmann::json>& configmaps);

  // Nodes as the API shows them (for reasons, and to forget deleted nodes' reservations).
  void UpsertNode(const nlohmann::json& node);
  void RemoveNode(const std::string& name);
  void ReplaceNodes(const std::vector<nlohmann::json>& nodes);

  NodeVerdict Evaluate(const PodRequest& pod, const std::string& node) const;
  // With `passed_index`: the indices in `nodes` of those that passed go there, and
  // FilterOutcome::passed stays empty (no copies of the names).
  FilterOutcome Filter(const PodRequest& pod, const std::vector<std::string>& nodes,
                       std::vector<size_t>* passed_index = nullptr) const;
  // One entry per node, in order; nodes that do not fit score 0.
  std::vector<std::pair<std::string, int>> Prioritize(const PodRequest& pod,
                                                      const std::vector<std::string>& nodes) const;
  // The same scores, parallel to `nodes`.
  std::vector<int> Scores(const PodRequest& pod, const std::vector<std::string>& nodes) const;

  // Checks the fit now and reserves the units. kUnavailable with the reason when the pod no longer
  // fits. A pod that already holds a reservation on `node` keeps it (*already = true): a repeated
  // bind must not drop the units of the one that succeeded.
  Result<std::vector<Assignment>> Reserve(const PodRequest& pod, const std::string& node,
                                          bool* already = nullptr);
  void Unreserve(const std::string& pod_key, const std::string& node);

  ViewStats stats() const;
  // The resourceVersion of the node's object as last seen ("" when none).
  std::string ObjectVersion(const std::string& node) const;

 private:
  struct Reservation {
    std::string pod_key;
    std::vector<Assignment> assignments;
    Clock::TimePoint expires;
  };
  struct Entry {
    std::string object_name;
    std::string resource_version;
    Clock::TimePoint changed_at;
    std::optional<NodeMemory> memory;
    std::string error;  // when memory is empty
    // Summary of `memory`, computed when the object changes (filter reads it per node per call).
    Clock::Duration stale_after{0};
    int64_t largest_free = 0;   // over healthy GPUs
    int64_t healthy_total = 0;  // total units of the healthy GPUs
    size_t resource = 0;        // memory->resource, as its index in resources_
    struct Units {
      int64_t free = 0;  // 0 when unhealthy
      int64_t total = 0;
    };
    // Per GPU, as memory->gpus: 16 bytes each (not NodeMemory's 96), held in the entry itself
    // for up to 8 GPUs, so that evaluating a node touches no other allocation.
    struct UnitsList {
      static constexpr size_t kInline = 8;
      std::array<Units, kInline> small{};
      std::vector<Units> large;
      size_t n = 0;
      const Units& operator[](size_t i) const { return n <= kInline ? small[i] : large[i]; }
      void Assign(const std::vector<Units>& all) {
        n = all.size();
        large.clear();
        if (n <= kInline) {
          std::copy(all.begin(), all.end(), small.begin());
        } else {
          large = all;
        }
      }
    };
    UnitsList units;
  };
  // Per-call constants, computed once per verb rather than once per node.
  struct EvalContext {
    Clock::TimePoint now;
    std::string pod_key;
    bool assignments = true;                 // fill NodeVerdict::assignments (bind needs them)
    bool score = true;                       // compute NodeVerdict::score (filter does not need it)
    mutable std::optional<size_t> resource;  // the pod's in resources_ (found once, under mu_)
  };
  struct NodeInfo {
    bool pool_label = false;
  };

  using Objects = std::unordered_map<std::string, Entry>;
  // A filter's lookups, for the prioritize of the same pod that follows it: the objects of the
  // nodes that passed, valid while the view's version is unchanged (no object, node or
  // reservation changed; element pointers of an unordered_map survive anything but erase).
  struct FilterMemo {
    std::string uid, pod_key, resource;
    std::vector<int64_t> units;  // containers, -1, init containers
    uint64_t version = 0;
    std::vector<const Objects::value_type*> passed;
  };
  static constexpr size_t kFilterMemos = 16;

  EvalContext Context(const PodRequest& pod, bool assignments, bool score) const;
  // `hint`: the node's object, already found; `found`: set to the object found (or nullptr).
  NodeVerdict EvaluateLocked(const PodRequest& pod, const std::string& node, const EvalContext& ctx,
                             const Objects::value_type* hint = nullptr,
                             const Objects::value_type** found = nullptr) const;
  void DropListedReservations(const std::string& node, const NodeMemory& memory);
  void PurgeExpiredLocked();

  const Clock& clock_;
  const ViewOptions options_;
  mutable std::shared_mutex mu_;
  Objects objects_;                                                         // node → its object
  std::map<std::string, std::string> object_nodes_;                         // object name → node
  std::unordered_map<std::string, std::vector<Reservation>> reservations_;  // node → reservations
  std::map<std::string, NodeInfo> nodes_;
  bool nodes_known_ = false;
  std::vector<std::string> resources_;  // the memory resources objects name (a handful)
  uint64_t version_ = 0;                // bumped by every change, under mu_ held exclusively

  mutable std::mutex memo_mu_;  // filter runs under mu_ shared: the memos have their own lock
  mutable std::deque<FilterMemo> memos_;
};

}  // namespace gpulet::extender
