// Cluster state for placement: nodes (CPU, memory, GPUs with their free milli-share each) and pods
// (CPU, memory, GPU count and per-GPU share, allowed GPU models). Plain values, no I/O: the same
// types describe a replayed trace and a live cluster read from the API server.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpulet::placement {

// One GPU is 1000 milli-GPU; a sharing pod asks for less than that on one GPU.
inline constexpr int32_t kMilliPerGpu = 1000;
// GPUs of one node are addressed by a bit mask (bit i = GPU index i), so a node has at most 32.
inline constexpr int kMaxGpusPerNode = 32;
using GpuSet = uint32_t;

// What GpuClustering groups pods by: sharing pods are one class, whole-GPU pods one class per GPU
// count (1..8); larger counts share the last class.
inline constexpr int kPodClasses = 10;

struct Pod {
  std::string name;
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int32_t num_gpu = 0;    // GPUs requested
  int32_t gpu_milli = 0;  // share of each of them, 1..1000 (0 when num_gpu == 0)
  // Allowed GPU models as a bit mask over Cluster::models; meaningful only when constrained.
  // A constrained pod whose models are all absent from the cluster has mask 0 and fits nowhere.
  bool model_constrained = false;
  uint64_t model_mask = 0;
  // The model list as the trace spells it ("V100M16|V100M32"; empty = any). The artifact's
  // protocol keys pod shapes by this text (it orders equally frequent shapes by it).
  std::string gpu_spec;

  bool IsSharing() const { return num_gpu == 1 && gpu_milli < kMilliPerGpu; }
  int64_t GpuMilliRequest() const { return int64_t{num_gpu} * gpu_milli; }
  // 0: sharing; n: n whole GPUs (capped at kPodClasses-1); -1: CPU only.
  int PodClass() const;
};

struct Node {
  std::string name;
  int model = -1;  // index into Cluster::models; -1 for a node without GPUs
  int64_t cpu_milli = 0;
  int64_t cpu_free = 0;
  int64_t memory_mib = 0;
  int64_t memory_free = 0;
  std::vector<int32_t> gpu_free;  // free milli of each GPU, 0..1000; index = GPU index
  // GPU pods placed here, by Pod::PodClass (GpuClustering reads it).
  std::array<int32_t, kPodClasses> pods_by_class{};

  int GpuCount() const { return static_cast<int>(gpu_free.size()); }
  int64_t GpuFreeMilli() const;
  int FullyFreeGpus() const;
};

struct Cluster {
  std::vector<std::string> models;  // GPU model names; Node::model and Pod::model_mask index it
  std::vector<Node> nodes;

  // Index of `model`, added when new (at most 64 models).
  int InternModel(std::string_view model);
  // Index of `model`, or -1.
  int FindModel(std::string_view model) const;
  int64_t GpuCapacityMilli() const;
  int64_t GpuAllocatedMilli() const;
};

// Everything a policy may read of a node apart from its name: two nodes in the same state get the
// same answer from every policy.
bool SameState(const Node& a, const Node& b);

// The node can host the pod: CPU, memory, GPU model, and num_gpu GPUs with gpu_milli free each.
bool Fits(const Node& node, const Pod& pod);

// Takes the pod's resources from the node: CPU, memory, and gpu_milli from each GPU in `gpus`
// (which must hold num_gpu GPUs that fit; callers get them from a Policy).
void Apply(Node& node, const Pod& pod, GpuSet gpus);

// The GPUs a baseline policy uses on a node that fits: a sharing pod takes the best-fitting GPU
// (the least free share that is enough, lowest index on ties); a whole-GPU pod takes the
// lowest-indexed fully free GPUs. 0 for a CPU-only pod.
GpuSet BestFitGpus(const Node& node, const Pod& pod);

}  // namespace gpulet::placement
