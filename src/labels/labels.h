// Node labels in GPU Feature Discovery's names (`nvidia.com/gpu.product`, `nvidia.com/gpu.count`,
// …), written as a Node Feature Discovery "local" feature file so existing node selectors and
// affinities keep working when gpulet replaces NVIDIA's GFD.
//
// Contract:
// - NodeLabels is pure: the labels follow from the Inventory, the sharing Plan and the MIG
//   strategy (plus the optional machine type and timestamp the caller passes).
// - Every value is a valid Kubernetes label value (≤ 63 characters of [A-Za-z0-9._-], starting
//   and ending with an alphanumeric); product and machine names have spaces and other characters
//   replaced by '-', as GFD does.
// - A node without GPUs gets no labels (an empty feature file removes the old ones).
// - Mixed nodes (different GPU models) are labelled after GPU 0, as GFD does.
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

struct LabelOptions {
  config::MigStrategy mig_strategy = config::MigStrategy::kNone;
  std::string machine;                  // e.g. "DGX-H100"; empty: no gpu.machine label
  std::optional<int64_t> timestamp;     // seconds since the epoch; absent: no gfd.timestamp
};

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
// Empty when the file is missing or empty.
std::string ReadMachineType(const std::string& path);

}  // namespace gpulet::labels
