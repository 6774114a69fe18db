// The Inventory: everything gpulet knows about a node's GPUs, read from NVML once at discovery
// and immutable afterwards. Every consumer (sharing plan, device plugin, exporter, Slurm config)
// reads this value; none of them re-enumerates NVML. Health is not part of the Inventory: it
// changes over time and lives in gpu::HealthMonitor.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace gpulet::gpu {

class Nvml;

struct MigDevice {
  unsigned parent_index = 0;   // index of the physical GPU
  unsigned mig_index = 0;      // position among the parent's MIG devices
  std::string uuid;            // "MIG-…"
  std::string profile;         // "1g.5gb", "3g.20gb", "1c.3g.20gb", "1g.10gb+me"
  unsigned gpu_instance_id = 0;
  unsigned compute_instance_id = 0;
  uint64_t memory_mib = 0;
  unsigned sm_count = 0;
  unsigned gi_slices = 0;
  unsigned ci_slices = 0;
  // Engines of the GPU instance (nvmlDeviceGetAttributes' shared*Count), for GFD's labels.
  unsigned copy_engines = 0, decoders = 0, encoders = 0, jpeg_decoders = 0, ofa_engines = 0;
  // /dev/nvidia-caps/nvidia-capN nodes for the GPU instance and compute instance.
  std::string gi_cap_path;
  std::string ci_cap_path;
};

// How two GPUs reach each other over PCIe, best first (mirrors nvidia-smi topo -m).
enum class PcieRelation {
  kSameBoard,    // PIX on one board (NVML INTERNAL/SINGLE)
  kSameSwitch,   // PXB: through PCIe switches, no host bridge (MULTIPLE)
  kHostBridge,   // PHB: through the CPU's host bridge
  kSameCpu,      // NODE: same NUMA node, across host bridges
  kCrossCpu,     // SYS: across the CPU interconnect
  kUnknown,
};
const char* PcieRelationName(PcieRelation r);  // "PIX", "PXB", "PHB", "NODE", "SYS", "?"

struct Link {
  unsigned nvlinks = 0;  // active NVLinks between the pair (0 = none)
  PcieRelation pcie = PcieRelation::kUnknown;
};

struct Gpu {
  unsigned index = 0;
  std::string uuid;            // "GPU-…"
  std::string name;            // "NVIDIA H100 80GB HBM3"
  uint64_t memory_mib = 0;
  std::string pci_bus_id;      // "00000000:18:00.0" as NVML reports it
  uint32_t pci_device_id = 0;  // NVML's pciDeviceId: device << 16 | vendor, e.g. 0x233010DE
  // The PCI class from sysfs (0x030200 3D controller, 0x030000 VGA); absent when unreadable.
  std::optional<uint32_t> pci_class;
  unsigned minor = 0;          // /dev/nvidia<minor>
  int cc_major = 0, cc_minor = 0;
  std::string architecture;    // "hopper", "ampere", "ada", … or "unknown"
  std::optional<int> numa_node;      // from sysfs; absent when unknown
  std::string cpu_affinity;          // sysfs local_cpulist, e.g. "0-55,112-167"; empty when unknown
  bool mig_capable = false;
  bool mig_enabled = false;
  std::vector<MigDevice> mig_devices;  // empty unless mig_enabled

  std::string device_path() const { return "/dev/nvidia" + std::to_string(minor); }
  std::string compute_capability() const {
    return std::to_string(cc_major) + "." + std::to_string(cc_minor);
  }
};

struct Inventory {
  std::string driver_version;  // "550.54.15"
  std::string cuda_version;    // "12.4"
  std::string nvml_library;    // the library path it was read through
  std::vector<Gpu> gpus;
  // links[i][j] for GPU indices i != j; links[i][i] is unused.
  std::vector<std::vector<Link>> links;

  const Gpu* FindByUuid(const std::string& uuid) const;
  const MigDevice* FindMigByUuid(const std::string& uuid) const;
  unsigned NvlinkCount(unsigned a, unsigned b) const { return links[a][b].nvlinks; }
  size_t MigDeviceCount() const;
};

struct DiscoverOptions {
  // Root for /sys lookups (NUMA node, CPU list of a PCI device). Tests and the simulator point it
  // at a directory tree of their own.
  std::string sysfs_root = "/sys";
  // Root for /proc lookups (MIG capability minor numbers in /proc/driver/nvidia-caps).
  std::string procfs_root = "/proc";
};

// Reads the whole inventory. Fails (never returns a partial inventory) when any GPU is lost
// (kGpuLost) or a required query fails (kNvmlError); the message names the GPU and the call.
Result<Inventory> Discover(const Nvml& nvml, const DiscoverOptions& options = {});

}  // namespace gpulet::gpu
