// The scheduler extender's view of the fleet's GPU memory pools, and the decisions made on it
// (docs/memory-requests.md). Pure: no I/O; time comes from an injected Clock.
//
// Input: the per-node ConfigMaps the node agents publish (contract in docs/memory-requests.md:
// `gpulet-memory-<node>`, data["memory.json"] with per-GPU free units, a generation, the pods the
// kubelet has placed). Output: Filter (which nodes can hold a pod, and why not), Prioritize
// (0..MaxExtenderPriority per node) and Reserve (the units a bound pod will take, held in memory
// under its UID until evidence ends it: the node's object lists the pod, or the API server shows
// it gone (EndReservation); a timeout only as the last resort).
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
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "extender/scoring.h"
#include "placement/cluster.h"

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

// What a pod asks of a memory resource, per container kind, as the kubelet allocates devices
// (its device manager): init containers in order, then the app containers. An ordinary init
// container's units are released to the pod when it ends and reused first by the containers
// after it (which the device plugin then pins to that GPU); a restartable init container (a
// sidecar, restartPolicy: Always) keeps its units for the pod's life, beside the app's.
struct PodRequest {
  std::string ns, name, uid;
  std::string resource;  // "" when the pod asks for no memory resource
  struct Step {
    ContainerUnits container;
    enum Kind { kInit, kSidecar, kApp } kind = kApp;
  };
  std::vector<Step> steps;  // every container with a non-zero request, in the kubelet's order
  // A container names a memory resource, even with 0 units: kube-scheduler then calls the
  // extender for the pod (its managedResources match on the name alone) and leaves the bind to it.
  bool names_memory = false;
  std::string key() const { return ns + "/" + name; }
  bool asks() const { return !resource.empty() && !steps.empty(); }
  // Units the pod holds on the node once running: max(the largest ordinary init container,
  // sidecars + app containers), the kubelet's effective request.
  int64_t total() const;
};

// Which extended resources are GPU memory pools: gpulet.io/gpu-memory-*, and any other name a
// node object publishes (a pool with `rename:`) or the operator lists.
using MemoryResourceTest = std::function<bool(std::string_view)>;
bool DefaultMemoryResource(std::string_view name);

// From a v1.Pod: requests (or, where absent, limits) of the memory resources. A pod asking for
// two different memory resources, or a quantity that is not a whole number, is an error naming
// the container and field. The text form reads the pod without building a DOM (bounded memory
// whatever the pod holds).
Result<PodRequest> ParsePodRequest(const nlohmann::json& pod,
                                   const MemoryResourceTest& is_memory = DefaultMemoryResource);
Result<PodRequest> ParsePodRequestText(std::string_view pod_json,
                                       const MemoryResourceTest& is_memory = DefaultMemoryResource);
// A Kubernetes quantity (k8s/quantity.h: "20", "2k", "2Ki", "1e3") that is a whole number of
// units; a JSON number is read as its text.
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
  // With a placement policy (ViewOptions::placement): its score for the node, before the pick of
  // the request's nodes (scoring.h); nullopt when the policy cannot place the pod there.
  std::optional<double> policy_score;
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
  // The last resort: a reservation ends when its node's object lists the pod, or when the API
  // server says the pod is gone (EndReservation); only if neither ever happens, after this.
  Clock::Duration reservation_timeout = std::chrono::minutes(10);
  // Memory resources besides gpulet.io/gpu-memory-* and those the node objects publish.
  std::vector<std::string> memory_resources;
  // Prioritize and the GPU reserved at bind for a one-container pod: a placement policy
  // (scoring.h), or, when null, `policy` (the extender's own best fit or spread).
  Policy policy = Policy::kBestFit;
  std::shared_ptr<const PlacementScorer> placement;
  // Node lists remembered (resolved to nodes, keyed by their bytes) take at most this much; a
  // list larger than half of it is resolved each time and not kept.
  size_t remembered_bytes = 16 << 20;
};

struct ViewStats {
  size_t objects = 0;
  size_t malformed = 0;
  size_t stale = 0;
  size_t reservations = 0;
  int64_t reserved_units = 0;
};

// Node names as a request carries them. `names`: views that outlive the call. `text`: when the
// request's JSON array held only plain names (no escapes), the array's bytes between its brackets,
// exactly as sent; empty otherwise. A list with `text` is resolved to the view's nodes once and
// remembered by those bytes (kube-scheduler sends the same list pod after pod, and prioritize
// gets the list filter answered), so a repeated list costs one comparison of its bytes instead
// of a lookup per name. `text` must be the encoding of `names`: the view trusts it.
struct NameList {
  std::vector<std::string_view> names;
  std::string_view text;
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
  FilterOutcome Filter(const PodRequest& pod, const NameList& nodes,
                       std::vector<size_t>* passed_index = nullptr) const;
  // One entry per node, in order; nodes that do not fit score 0.
  std::vector<std::pair<std::string, int>> Prioritize(const PodRequest& pod,
                                                      const std::vector<std::string>& nodes) const;
  // The same scores, parallel to `nodes`.
  std::vector<int> Scores(const PodRequest& pod, const std::vector<std::string>& nodes) const;
  std::vector<int> Scores(const PodRequest& pod, const NameList& nodes) const;

  // Checks the fit now and reserves the units. kUnavailable with the reason when the pod no longer
  // fits. A pod that already holds a reservation on `node` keeps it (*already = true): a repeated
  // bind must not drop the units of the one that succeeded.
  // Reservations are keyed by the pod's UID (a recreated pod of the same name is another pod);
  // a pod without a UID cannot be reserved (kInvalidInput).
  Result<std::vector<Assignment>> Reserve(const PodRequest& pod, const std::string& node,
                                          bool* already = nullptr);
  void Unreserve(const std::string& uid, const std::string& node);
  // Ends the pod's reservation wherever it is (the pod is gone, or bound elsewhere).
  void EndReservation(const std::string& uid);

  struct HeldPod {
    std::string uid, ns, name, node;
    Clock::Duration age{0};
  };
  // The reservations held now, for the check that asks the API server whether their pods still
  // exist (service.cc).
  std::vector<HeldPod> Reservations() const;
  // The units the pod `uid` holds on `node` (nullopt: no reservation there).
  std::optional<std::vector<Assignment>> ReservationOf(const std::string& uid,
                                                       const std::string& node) const;

  // True for the memory resources: DefaultMemoryResource, a resource some node object
  // publishes, or one of options.memory_resources.
  bool IsMemoryResource(std::string_view name) const;

  ViewStats stats() const;
  // The resourceVersion of the node's object as last seen ("" when none).
  std::string ObjectVersion(const std::string& node) const;
  // Name lists remembered (for tests: a repeated list must not be resolved again).
  size_t remembered_lists() const;

 private:
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  static constexpr size_t kRememberedLists = 8;

  struct Reservation {
    std::string uid;
    std::string pod_key;  // namespace/name: what a node object lists
    std::vector<Assignment> assignments;
    Clock::TimePoint made;
    Clock::TimePoint expires;  // the last resort, when no evidence ever comes
    // The node's object listed a pod of this name when the reservation was made (an earlier pod
    // of the same name, e.g. a StatefulSet's): that listing is no evidence for this pod, which
    // counts as listed only once an object without the name has been seen.
    bool name_listed_before = false;
  };
  struct GpuUnits {
    int64_t free = 0;  // 0 when unhealthy
    int64_t total = 0;
  };
  // Per GPU, held in the slot itself for up to 8 GPUs, so that evaluating a node touches no other
  // allocation.
  struct UnitsList {
    static constexpr size_t kInline = 8;
    std::array<GpuUnits, kInline> small{};
    std::vector<GpuUnits> large;
    size_t n = 0;
    const GpuUnits& operator[](size_t i) const { return n <= kInline ? small[i] : large[i]; }
    void Assign(const std::vector<GpuUnits>& all) {
      n = all.size();
      large.clear();
      if (n <= kInline) {
        std::copy(all.begin(), all.end(), small.begin());
      } else {
        large = all;
      }
    }
  };
  // A node that has an object: what filter and prioritize read per node per call, computed when
  // the object changes, dense by slot number. The rest is in SlotInfo (reasons, binds).
  struct Slot {
    Clock::TimePoint changed_at;  // resourceVersion last changed, on our clock
    Clock::Duration stale_after{0};
    int64_t largest_free = 0;   // over healthy GPUs
    int64_t healthy_total = 0;  // total units of the healthy GPUs
    uint32_t resource = 0;      // the object's resource, as its index in resources_
    bool ok = false;            // the object parsed (else SlotInfo::error says why)
    bool reserved = false;      // reservations_ holds entries for the node
    UnitsList units;
    // For a placement policy: the GPU model (index into models_), and the pods the object lists
    // by placement::Pod::PodClass.
    int model = -1;
    std::array<int32_t, placement::kPodClasses> classes{};
  };
  struct SlotInfo {
    std::string node;  // empty: the slot is on the free list
    std::string object_name;
    std::string resource_version;
    std::optional<NodeMemory> memory;
    std::string error;  // when memory is empty
  };
  // Per-call constants, computed once per verb rather than once per node.
  struct EvalContext {
    Clock::TimePoint now;
    std::string pod_key;
    std::string pod_uid;
    bool assignments = true;                 // fill NodeVerdict::assignments (bind needs them)
    bool score = true;                       // compute NodeVerdict::score (filter does not need it)
    mutable std::optional<size_t> resource;  // the pod's in resources_ (found once, under mu_)
  };
  struct NodeInfo {
    bool pool_label = false;
  };
  // A name list resolved to slots (kNoSlot: no object), valid while layout_ is unchanged.
  struct Resolved {
    std::string text;
    uint64_t layout = 0;
    std::vector<uint32_t> slots;
  };
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  EvalContext Context(const PodRequest& pod, bool assignments, bool score) const;
  NodeVerdict EvaluateLocked(const PodRequest& pod, uint32_t slot, std::string_view node,
                             const EvalContext& ctx) const;
  uint32_t SlotOf(std::string_view node) const;
  // The node's slot, made when it has none (a new layout).
  uint32_t MakeSlotLocked(const std::string& node);
  void FreeSlotLocked(uint32_t slot);
  // Slot::reserved from reservations_, after they changed for `node`.
  void SyncReservedLocked(const std::string& node);
  std::shared_ptr<const Resolved> ResolveLocked(const NameList& list) const;
  void RememberLocked(std::shared_ptr<const Resolved> r) const;
  bool Rememberable(std::string_view text) const;
  void DropListedReservations(const std::string& node, const NodeMemory& memory);
  void PurgeExpiredLocked();

  const Clock& clock_;
  const ViewOptions options_;
  mutable std::shared_mutex mu_;
  std::vector<Slot> slots_;
  std::vector<SlotInfo> info_;  // parallel to slots_
  std::vector<uint32_t> free_slots_;
  std::unordered_map<std::string, uint32_t, NameHash, std::equal_to<>> slot_of_;  // node → slot
  uint64_t layout_ = 0;  // bumped when a slot is made or freed (remembered lists re-resolve)
  std::map<std::string, std::string> object_nodes_;                         // object name → node
  std::unordered_map<std::string, std::vector<Reservation>> reservations_;  // node → reservations
  std::map<std::string, NodeInfo, std::less<>> nodes_;
  bool nodes_known_ = false;
  std::vector<std::string> resources_;  // the memory resources objects name (a handful)
  placement::Cluster models_;           // GPU models for the placement policy (its own first)

  // Filter and prioritize run under mu_ shared: the remembered lists have their own lock.
  mutable std::mutex resolved_mu_;
  mutable std::deque<std::shared_ptr<const Resolved>> resolved_;  // most recently used first
};

}  // namespace gpulet::extender
