// GetPreferredAllocation: which `size` devices out of `available` to give a container, from the
// Inventory's cached link matrix (never NVML per call; NVIDIA's plugin re-enumerates NVML here and
// takes seconds on 8 GPUs).
//
// Contract:
// - Every must_include ID is in the answer; the answer has exactly `size` IDs, all from
//   `available` ∪ `must_include`, no duplicates, sorted in plan order.
// - Among the candidate sets, the one with the most NVLinks between its members wins; ties go to
//   PCIe closeness (same board > same switch > host bridge > same CPU > across CPUs), then to the
//   lowest GPU indices: the answer is deterministic.
// - IDs in `available` the plan does not know are skipped (a stale kubelet view must not fail
//   admission, NVIDIA #2038); unknown must_include IDs, duplicates, or fewer devices than `size`
//   are INVALID_ARGUMENT-style errors (kInvalidInput) naming the ID.
// - Search: exhaustive when the number of combinations is small (8 GPUs), otherwise greedy growth
//   from every seed with incremental gains; O(n² · size) — well under 1 ms for 64 GPUs.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "gpu/inventory.h"
#include "sharing/plan.h"

namespace gpulet::deviceplugin {

Result<std::vector<std::string>> PreferredAllocation(const sharing::Resource& resource,
                                                     const gpu::Inventory& inventory,
                                                     const std::vector<std::string>& available,
                                                     const std::vector<std::string>& must_include,
                                                     int size);

}  // namespace gpulet::deviceplugin
