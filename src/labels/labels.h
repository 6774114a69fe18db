// Node labels in GPU Feature Discovery's names (`nvidia.com/gpu.product`, `nvidia.com/gpu.count`,
// …), written as a Node Feature Discovery "local" feature file so existing node selectors and
// affinities keep working when gpulet replaces NVIDIA's GFD.
//
// Contract:
// - NodeLabels is pure: the labels follow from the Inventory, the sharing Plan and the MIG
//   strategy (plus the optional machine type and timestamp the caller passes).
// - Values are GFD's (internal/lm in NVIDIA's k8s-device-plugin): gpu.family from the compute
//   capability (ada-lovelace, hopper, blackwell, …); gpu.replicas is the replicas of the
//   sharing entry for nvidia.com/gpu (renamed or not), 0 on MIG-enabled GPUs; products are
//   sanitised as GFD does (characters other than [A-Za-z0-9-_. ] removed, runs of spaces → '-')
//   and end in -SHARED when shared and not renamed; mig.strategy only when the strategy is not
//   none; gpu.mode from the PCI class; gpu.machine always ("unknown" without a machine type).
// - mig.strategy=single on an invalid node (MIG GPUs that are empty, mixed with full GPUs, or with
//   more than one profile) writes GFD's MIG-INVALID labels (product <model>-MIG-INVALID, count,
//   replicas and memory 0). Mixed labels every profile: .product, .count, .replicas,
//   .sharing-strategy, .memory, .multiprocessors, .slices.{gi,ci}, .engines.{copy,decoder,
//   encoder,jpeg,ofa}.
// - A node without GPUs gets no labels (an empty feature file removes the old ones).
// - Mixed nodes (different GPU models) are labelled after GPU 0.
// - A node with a memory pool (sharing.memory) also gets gpulet's own labels
//   gpulet.io/gpu-memory.pool=true and gpulet.io/gpu-memory.unit=<unit> ("1Gi"), which
//   `gpulet extender` and node selectors use to find such nodes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/status.h"
#include "config/config.h"
#include "gpu/inventory.h"
#include "sharing/plan.h"

namespace gpulet::labels {

using Labels = std::map<std::string, std::string>;

inline constexpr const char* kMemoryPoolLabel = "gpulet.io/gpu-memory.pool";
inline constexpr const char* kMemoryUnitLabel = "gpulet.io/gpu-memory.unit";

struct LabelOptions {
  config::MigStrategy mig_strategy = config::MigStrategy::kNone;
  std::string machine;               // e.g. "DGX-H100"; empty: gpu.machine=unknown
  std::optional<int64_t> timestamp;  // seconds since the epoch; absent: no gfd.timestamp
  // The sharing config, for replicas and renames as GFD reads them (by the entry's original
  // name). Absent: taken from the plan's resources.
  const config::Sharing* sharing = nullptr;
};

// GFD's family for a compute capability: "ampere" (8.0–8.8), "ada-lovelace" (8.9), "hopper",
// "blackwell" (10.x, 12.x), …; "undefined" when unknown.
std::string ArchFamily(int cc_major, int cc_minor);

// GFD's product sanitising: characters other than [A-Za-z0-9-_. ] removed, then runs of spaces
// joined with '-'.
std::string SanitizeProduct(const std::string& raw);

Labels NodeLabels(const gpu::Inventory& inventory, const sharing::Plan& plan,
                  const LabelOptions& options);

// "nvidia.com/mig-1g.10gb+me" style names become "mig-1g.10gb.me": '+' is not allowed in keys.
std::string MigLabelPrefix(const std::string& profile);

// Replaces every character a label value may not hold with '-', trims leading/trailing
// non-alphanumerics and cuts to 63 characters.
std::string SanitizeValue(const std::string& raw);

// The feature file body: one "key=value" line per label, sorted by key.
std::string FeatureFile(const Labels& labels);

// Writes the feature file atomically (temporary file in the same directory, fsync, rename), so
// NFD never reads half a file. Creates no directories: a missing directory is kNotFound naming
// it. Other failures are kUnavailable naming the path and errno.
Status WriteFeatureFile(const std::string& path, const Labels& labels);

// The machine type GFD reports: the DMI product name (/sys/class/dmi/id/product_name), sanitized.
// Empty when the file is missing or empty (the label then says "unknown", as GFD's does).
std::string ReadMachineType(const std::string& path);

}  // namespace gpulet::labels
