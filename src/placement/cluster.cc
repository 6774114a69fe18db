#include "placement/cluster.h"

#include <algorithm>
#include <stdexcept>

namespace gpulet::placement {

int Pod::PodClass() const {
  if (num_gpu <= 0) return -1;
  if (IsSharing()) return 0;
  return std::min(num_gpu, kPodClasses - 1);
}

int64_t Node::GpuFreeMilli() const {
  int64_t total = 0;
  for (int32_t f : gpu_free) total += f;
  return total;
}

int Node::FullyFreeGpus() const {
  return static_cast<int>(std::count(gpu_free.begin(), gpu_free.end(), kMilliPerGpu));
}

int Cluster::InternModel(std::string_view model) {
  int found = FindModel(model);
  if (found >= 0) return found;
  if (models.size() >= 64) throw std::length_error("more than 64 GPU models");
  models.emplace_back(model);
  return static_cast<int>(models.size()) - 1;
}

int Cluster::FindModel(std::string_view model) const {
  for (size_t i = 0; i < models.size(); ++i)
    if (models[i] == model) return static_cast<int>(i);
  return -1;
}

int64_t Cluster::GpuCapacityMilli() const {
  int64_t total = 0;
  for (const Node& n : nodes) total += int64_t{n.GpuCount()} * kMilliPerGpu;
  return total;
}

int64_t Cluster::GpuAllocatedMilli() const {
  int64_t total = 0;
  for (const Node& n : nodes) total += int64_t{n.GpuCount()} * kMilliPerGpu - n.GpuFreeMilli();
  return total;
}

bool SameState(const Node& a, const Node& b) {
  return a.model == b.model && a.cpu_free == b.cpu_free && a.memory_free == b.memory_free &&
         a.cpu_milli == b.cpu_milli && a.memory_mib == b.memory_mib && a.gpu_free == b.gpu_free &&
         a.pods_by_class == b.pods_by_class;
}

bool Fits(const Node& node, const Pod& pod) {
  if (node.cpu_free < pod.cpu_milli || node.memory_free < pod.memory_mib) return false;
  if (pod.num_gpu <= 0) return true;
  if (node.model < 0) return false;
  if (pod.model_constrained && (pod.model_mask >> node.model & 1U) == 0) return false;
  int enough = 0;
  for (int32_t f : node.gpu_free)
    if (f >= pod.gpu_milli && ++enough >= pod.num_gpu) return true;
  return false;
}

void Apply(Node& node, const Pod& pod, GpuSet gpus) {
  node.cpu_free -= pod.cpu_milli;
  node.memory_free -= pod.memory_mib;
  for (int i = 0; i < node.GpuCount(); ++i)
    if (gpus >> i & 1U) node.gpu_free[i] -= pod.gpu_milli;
  int cls = pod.PodClass();
  if (cls >= 0) ++node.pods_by_class[cls];
}

GpuSet BestFitGpus(const Node& node, const Pod& pod) {
  if (pod.num_gpu <= 0) return 0;
  if (pod.IsSharing()) {
    int best = -1;
    for (int i = 0; i < node.GpuCount(); ++i) {
      int32_t f = node.gpu_free[i];
      if (f >= pod.gpu_milli && (best < 0 || f < node.gpu_free[best])) best = i;
    }
    return best < 0 ? 0 : GpuSet{1} << best;
  }
  GpuSet set = 0;
  int need = pod.num_gpu;
  for (int i = 0; i < node.GpuCount() && need > 0; ++i) {
    if (node.gpu_free[i] >= pod.gpu_milli) {
      set |= GpuSet{1} << i;
      --need;
    }
  }
  return need == 0 ? set : 0;
}

}  // namespace gpulet::placement
