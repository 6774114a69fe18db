// GPU fragmentation as the FGD paper defines it (Weng et al., USENIX ATC '23, section 4).
//
// A workload is summarised by its "typical pods": the most frequent pod shapes (CPU, GPU count,
// per-GPU share, allowed GPU models), most frequent first, until they cover `coverage` (95 %) of
// the pods, renormalised into a probability distribution. For one typical pod m, the free GPU
// share of a node n that m could not use is fragmented:
//   - m asks for no GPU, or n lacks CPU for m, or n's GPU model is not allowed for m, or n has
//   fewer
//     than num_gpu(m) GPUs with gpu_milli(m) free: every free milli-GPU of n is a fragment;
//   - otherwise the fragment is the free share of the GPUs with less than gpu_milli(m) free.
// The node's fragmentation is the expectation over the typical pods: F(n) = sum_m p_m * F_m(n),
// in milli-GPU. Memory is not part of the measure (as in the paper's simulator).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "placement/cluster.h"

namespace gpulet::placement {

struct TypicalPod {
  int64_t cpu_milli = 0;
  int32_t num_gpu = 0;
  int32_t gpu_milli = 0;
  bool model_constrained = false;
  uint64_t model_mask = 0;
  double probability = 0;
};

class TypicalPods {
 public:
  TypicalPods() = default;
  // From the workload's pods: shapes counted, the most frequent kept until they cover `coverage`
  // of the pods (ties in count broken by shape, so the result does not depend on pod order).
  static TypicalPods FromWorkload(std::span<const Pod> pods, double coverage = 0.95);
  // From an explicit distribution (probabilities are renormalised to sum to 1).
  static TypicalPods FromList(std::vector<TypicalPod> pods);

  const std::vector<TypicalPod>& pods() const { return pods_; }
  bool empty() const { return pods_.empty(); }

  // F(n) in milli-GPU for a node in this state (the GPU share list need not be sorted).
  double Fragmentation(int model, int64_t cpu_free, std::span<const int32_t> gpu_free) const;
  double Fragmentation(const Node& node) const {
    return Fragmentation(node.model, node.cpu_free, node.gpu_free);
  }

 private:
  static constexpr size_t kMaxShares = 64;
  // A typical pod that asks for GPUs, with the index of its share in shares_.
  struct GpuPod {
    int64_t cpu_milli;
    int32_t num_gpu;
    int share;
    bool model_constrained;
    uint64_t model_mask;
    double probability;
  };
  void Index();
  std::vector<TypicalPod> pods_;
  std::vector<int32_t> shares_;  // distinct gpu_milli of the GPU pods, descending
  // One-GPU pods without a model constraint, as a table: cpu_steps_ holds their CPU requests,
  // ascending; row k of table_ (shares_.size() wide) the probability per share of the first k.
  std::vector<int64_t> cpu_steps_;
  std::vector<double> table_;
  std::vector<GpuPod> other_pods_;  // every other GPU pod, by cpu_milli ascending
};

}  // namespace gpulet::placement
