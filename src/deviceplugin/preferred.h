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
// - Shared resources (replica IDs "<uuid>::<n>") are not scored by links: the policy decides.
//   kDistributed (default) takes each next replica from the physical device with the fewest
//   replicas in use (by other containers, as `available` shows, plus this request), spreading
//   load; kPacked takes it from the device with the most in use that still has a free replica,
//   filling one device before the next. Ties go to plan order, and within a device the lowest
//   replica number is taken first, so the answer is deterministic.
// - Memory units (sharing.memory; IDs "<uuid>::mem-<k>") all come from one GPU: the one holding
//   the must-include units (units on two GPUs are an error), else, among the GPUs with at least
//   `size` free units, the one with the fewest free (config::MemoryPlacement::kBestFit: keeps
//   the large holes for large requests) or the most (kSpread); ties go to plan order. Within the
//   GPU the lowest free unit numbers are taken. NUMA: the kubelet's topology manager narrows
//   `available` to the aligned NUMA node(s) and the must-include units pin the GPU, so the answer
//   never leaves either. No GPU with enough free units is kInvalidInput naming the largest hole.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "gpu/inventory.h"
#include "sharing/plan.h"

namespace gpulet::deviceplugin {

enum class ReplicaPolicy { kDistributed, kPacked };
const char* ReplicaPolicyName(ReplicaPolicy p);  // "distributed", "packed"
// kInvalidInput: `invalid value "x" (want distributed|packed)`.
Result<ReplicaPolicy> ParseReplicaPolicy(std::string_view text);

Result<std::vector<std::string>> PreferredAllocation(
    const sharing::Resource& resource, const gpu::Inventory& inventory,
    const std::vector<std::string>& available, const std::vector<std::string>& must_include,
    int size, ReplicaPolicy policy = ReplicaPolicy::kDistributed,
    config::MemoryPlacement memory_placement = config::MemoryPlacement::kBestFit);

}  // namespace gpulet::deviceplugin
