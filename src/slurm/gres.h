// A node's Slurm GPU description, derived from the same Inventory that feeds Kubernetes, so the
// two never disagree about what a node has. Pure functions: no I/O, no NVML.
//
//   Inventory + GresOptions ──PlanNodeGres──▶ NodeGres ──RenderGresConf──▶ gres.conf text
//                                                  │      └RenderSlurmConf─▶ GresTypes + NodeName
//                                                  line
//   existing gres.conf ──ParseGresConf──▶ records ─┴─CompareGres──▶ mismatches (each named)
//
// What is generated (Slurm 22.05 semantics, verified against a real slurmctld/slurmd):
// - `AutoDetect=off` (Debian's 22.05 is built without the NVML plugin).
// - One `Name=gpu Type=<type> File=<dev-root>/dev/nvidia<minor>` line per whole GPU, with
//   `Cores=` (the GPU's local CPUs as Slurm core ids) and, when any NVLink exists and no GPU is in
//   MIG mode, `Links=` (NVLink count to each GPU in gres.conf order, -1 for itself).
// - One `Name=gpu Type=<type>_<profile> MultipleFiles=<parent dev>,<GI cap>,<CI cap>` line per
//   MIG device. The parent is not listed as a whole GPU.
// - With shards: `Name=shard Count=<n> File=<dev>` per whole GPU; with MPS:
//   `Name=mps Count=100 File=<dev>` per whole GPU (100 = percent, so --gres=mps:50 gives
//   CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "gpu/inventory.h"

namespace gpulet::slurm {

struct GresOptions {
  std::string node_name;      // required; a valid Slurm hostname
  std::string dev_root;       // prefix of every device path ("" = the real /dev)
  unsigned shards = 0;        // shards per whole GPU; 0 = no shard lines
  bool mps = false;           // Name=mps Count=100 per whole GPU
  std::string type_override;  // replaces the derived type of every GPU ("" = derive)
  // Node facts for the slurm.conf line (0 = omit the field).
  unsigned cpus = 0;
  unsigned threads_per_core = 1;  // >1: CPU ids map to core ids as cpu % (cpus / threads_per_core)
  // OS CPU id → Slurm's logical core index (hwloc order: by socket, then core), from
  // ReadCoreIndex. When set, Cores= is computed through it (the modulo rule above is only right
  // when CPU ids are numbered socket by socket); CPUs it lacks are left out.
  std::map<unsigned, unsigned> core_index;
  uint64_t real_memory_mib = 0;
  // Header comments: what generated the file and from which driver or fixture.
  std::string generator;  // "gpulet 0.1.0"
  std::string source;     // "driver 550.54.15 (libnvidia-ml.so.1)" or "fixture /path/x.yaml"
};

// One gres.conf record as Slurm would read it (one device per record).
struct GresRecord {
  std::string name;                // "gpu", "shard", "mps"
  std::string type;                // gpu only; may be empty in a parsed file
  std::vector<std::string> files;  // File (one) or MultipleFiles (several)
  bool multiple_files = false;
  std::optional<uint64_t> count;          // shard/mps Count
  std::optional<std::string> cores;       // canonical id list ("0-55"); nullopt = absent
  std::optional<std::vector<int>> links;  // nullopt = absent
  int line = 0;                           // line in the parsed file; 0 for generated records
  std::string describe() const;           // "Name=gpu Type=h100 File=/dev/nvidia0"
};

struct NodeGres {
  std::vector<GresRecord> records;
  std::vector<std::string> warnings;  // things the operator should know (rendered as comments)
};

// Slurm's logical core indices, as hwloc numbers cores: cores are ordered by socket
// (physical_package_id), then by their first CPU, and numbered from 0; every CPU of a core (its
// hyperthreads) maps to that core's index. Read from SYSFS/devices/system/cpu/cpuN/topology
// (physical_package_id, core_id) for the online CPUs. kNotFound when the topology files are absent.
Result<std::map<unsigned, unsigned>> ReadCoreIndex(const std::string& sysfs_root);

// Validates the node name (kUsage) and the options, then derives the records. Errors
// (kInvalidInput) name the GPU: a MIG device without nvidia-caps paths, a bad CPU list.
Result<NodeGres> PlanNodeGres(const gpu::Inventory& inventory, const GresOptions& options);

// The gres.conf text: header comments, AutoDetect=off, one line per record.
std::string RenderGresConf(const gpu::Inventory& inventory, const NodeGres& gres,
                           const GresOptions& options);
// "GresTypes=gpu[,shard][,mps]\nNodeName=<n> CPUs=… RealMemory=… Gres=gpu:<type>:<n>,…\n".
std::string RenderSlurmConf(const NodeGres& gres, const GresOptions& options);
// Just the Gres= value: "gpu:h100:8,shard:32".
std::string NodeGresValue(const NodeGres& gres);

// Slurm type from a product name: "NVIDIA H100 80GB HBM3" → "h100", "NVIDIA A100-SXM4-80GB" →
// "a100", "NVIDIA L4" → "l4"; a name without a model token is sanitised ("NVIDIA GeForce RTX
// 4090" → "geforce_rtx_4090"). Always non-empty and made of [a-z0-9_.].
std::string GpuTypeFromName(const std::string& product_name);
// Valid Slurm node name: an RFC 1123 hostname (letters, digits, '-', '.'-separated labels of at
// most 63 characters, no leading/trailing '-'), at most 253 characters.
bool IsValidNodeName(const std::string& name);

// Parses gres.conf text and returns the records that apply to `node_name` (lines without
// NodeName, and lines whose NodeName host list names it), one record per device file (File
// ranges like /dev/nvidia[0-3] are expanded). Errors (kInvalidInput) "file:line: field: problem".
struct ParsedGresConf {
  std::vector<GresRecord> records;
  std::optional<std::string> autodetect;  // the AutoDetect value that applies, if any
  int autodetect_line = 0;
};
Result<ParsedGresConf> ParseGresConf(const std::string& text, const std::string& file,
                                     const std::string& node_name);

// Compares the records in a gres.conf with the ones the hardware calls for. Each mismatch is one
// line: "gres.conf:7: Name=gpu File=/dev/nvidia3: Type is a100, hardware has h100",
// "missing: Name=gpu Type=h100 File=/dev/nvidia7", "gres.conf:9: Name=gpu File=/dev/nvidia9: no
// such device on this node". Empty: the file matches.
std::vector<std::string> CompareGres(const NodeGres& expected, const ParsedGresConf& actual,
                                     const std::string& file);

}  // namespace gpulet::slurm
