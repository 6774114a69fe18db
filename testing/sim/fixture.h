// A simulated node, read from a fixture file (YAML). The fixture states facts a real driver would
// report (names, memory, PCI addresses, NVLink wiring, MIG geometry); everything else the
// simulated library returns is derived from it deterministically.
//
// Schema (every key optional unless marked; unknown keys are errors):
//   name: dgx-h100                    default: the file's stem; seeds generated UUIDs
//   driver_version: 550.54.15         required
//   cuda_version: 12040               required (12040 = CUDA 12.4)
//   seed: 1                           telemetry seed
//   init_error: DRIVER_NOT_LOADED     nvmlInit_v2 fails with NVML_ERROR_<this>
//   numa_nodes: [{cpus: "0-55,112-167"}, …]   index = NUMA node id
//   mig_profiles: {1g.5gb: {slices: 1, memory_mb: 4864, sms: 14}, …}
//                 optional per profile: id (NVML profile id), placements: [0, 2, 4],
//                 placement_size (memory slices occupied); defaults from slices
//   defaults: {<any per-GPU key>}     applied to every GPU before its own keys
//   count: 64                         generate N GPUs (bus ids, NUMA and switches spread evenly)
//   gpus: [{<per-GPU keys>}, …]       one entry per GPU, in index order (required unless count)
//   nvlink: {all_pairs: 18} | {pairs: [[0, 1, 12], …]} | {switch_links: 18} (NVSwitch fabric)
// Per-GPU keys: name, uuid, bus_id ("0000:18:00.0"), minor, memory_mib, compute_capability
//   ("9.0"), architecture, sm_count, pci_device_id, pci_subsystem_id, numa, pcie_switch,
//   power_limit_w, idle_power_w, max_sm_clock_mhz, mem_clock_mhz, mig_capable,
//   mig: [{profile: 3g.20gb, gi: 2, ci: 0, placement: 4, uuid: …}, …] (non-empty = MIG enabled),
//   processes: [{pid: 4242, memory_mib: 2048, sm_util: 30, mem_util: 10, gi: 1, ci: 0}, …]
//   (compute processes; gi/ci only on a MIG GPU).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "sim/sim_process.h"

namespace gpulet::sim {

struct MigProfile {
  unsigned slices = 0;     // GPU instance slices (1..7)
  uint64_t memory_mb = 0;  // nvmlDeviceAttributes_t.memorySizeMB
  unsigned sms = 0;        // multiprocessorCount
  // Where the driver lets an instance of this profile start, in memory slices (0..7), and how
  // many memory slices it then occupies. Defaults follow A100/H100 from the slice count:
  // 1g: 0..6 size 1; 2g: 0,2,4 size 2; 3g: 0,4 size 4; 4g: 0 size 4; 7g: 0 size 8.
  unsigned id = 0;  // NVML_GPU_INSTANCE_PROFILE_*; default from slices (1g→0 … 7g→4)
  std::vector<unsigned> placements;
  unsigned placement_size = 0;
};

// Fills id / placements / placement_size left unset from the slice count.
void FillMigProfileDefaults(MigProfile& p, bool have_id);

struct MigDeviceSpec {
  std::string profile;  // "3g.20gb"
  unsigned gi = 0;      // GPU instance id
  unsigned ci = 0;      // compute instance id
  unsigned placement = 0;
  std::string uuid;  // "MIG-…"
  MigProfile facts;
};

struct GpuSpec {
  unsigned index = 0;
  std::string name;
  std::string uuid;  // "GPU-…"
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  unsigned minor = 0;
  uint64_t memory_mib = 0;
  int cc_major = 0, cc_minor = 0;
  std::string architecture;  // "hopper", "ampere", "ada", …
  unsigned sm_count = 0;
  unsigned pci_device_id = 0, pci_subsystem_id = 0;
  int numa = -1;         // -1: unknown
  int pcie_switch = -1;  // GPUs with the same switch id share a PCIe switch; -1: none
  unsigned power_limit_w = 300, idle_power_w = 60;
  unsigned max_sm_clock_mhz = 1980, mem_clock_mhz = 2619;
  bool mig_capable = false;
  std::vector<MigDeviceSpec> mig;  // non-empty: MIG mode enabled
  bool mig_mode = false;           // MIG enabled with no devices (set by the simulated driver)
  std::vector<SimProcess> processes;  // compute processes (fixture `processes:`)

  bool mig_enabled() const { return mig_mode || !mig.empty(); }
  // "00000000:18:00.0": NVML's busId form (8-hex-digit domain, upper-case).
  std::string NvmlBusId() const;
  // "0000:18:00.0": the legacy/sysfs form (4-hex-digit domain, lower-case).
  std::string SysfsBusId() const;
};

struct Fixture {
  std::string path;  // as loaded
  std::string name;
  std::string driver_version;
  int cuda_version = 0;
  uint64_t seed = 0;
  std::optional<int> init_error;       // an nvmlReturn_t
  std::vector<std::string> numa_cpus;  // index: NUMA node id
  // Optional CPU topology written to the fake sysfs (devices/system/cpu): `cpu_topology:
  // {sockets, cores_per_socket, threads_per_core, numbering: sequential|alternating}`.
  // Alternating: cpu0 on socket 0, cpu1 on socket 1, … (then the hyperthreads), as many BIOSes
  // number them; sequential: socket by socket. Absent: no CPU files (as before).
  struct CpuTopology {
    unsigned sockets = 1, cores_per_socket = 1, threads_per_core = 1;
    bool alternating = false;
  };
  std::optional<CpuTopology> cpu_topology;
  std::map<std::string, MigProfile> mig_profiles;
  std::vector<GpuSpec> gpus;
  // nvlinks[a][b]: NVLinks between GPUs a and b (symmetric). With NVSwitches this is the
  // effective count every pair gets through the fabric.
  std::vector<std::vector<unsigned>> nvlinks;
  // nvlink.switch_links: each GPU's links go to NVSwitches (DGX/HGX), not to a peer directly;
  // NVML then reports the switch as the remote end of every link. 0: direct links only.
  unsigned nvswitch_links = 0;

  // Link-ordered peers of `gpu`: the peer each NVLink index leads to (size = total links).
  std::vector<unsigned> NvlinkPeers(unsigned gpu) const;
  // "12.4" from 12040.
  std::string CudaVersionString() const;
};

// A UUID-shaped string derived from `key` ("GPU-" or "MIG-" `prefix`): stable across runs and
// machines.
std::string DerivedUuid(const std::string& prefix, const std::string& key);

// The whole of a fixture file; nullopt when it cannot be read.
std::optional<std::string> ReadFixtureText(const std::string& path);

// Reads and validates a fixture (fixture_yaml.cc). Errors: kNotFound (no such file), kInvalidInput
// "<file>:<line>: <field>: <problem>".
Result<Fixture> LoadFixture(const std::string& path);
// Same, from text; `file` names it in errors.
Result<Fixture> ParseFixture(const std::string& text, const std::string& file);

// The UUID the simulated driver gives MIG device gi/ci of a GPU that names none: stable, so a
// device destroyed and created again at the same ids keeps its UUID.
std::string DerivedMigUuid(const std::string& gpu_uuid, unsigned gi, unsigned ci);

// What a container runtime leaves visible to NVML inside a container, as the NVIDIA runtime does
// with NVIDIA_VISIBLE_DEVICES: the simulated driver reads it from GPULET_SIM_VISIBLE_DEVICES.
// `spec` is a comma list of GPU indexes ("3"), GPU UUIDs ("GPU-…"), MIG UUIDs ("MIG-…") or
// "<gpu>:<mig>" (MIG index on that GPU); "", "all" = everything; "none"/"void" = nothing.
// A MIG device makes its parent GPU visible with only the named MIG devices. The visible GPUs
// are numbered from 0 in index (PCI) order, whatever the order in `spec`, as NVML numbers them
// in a container; their UUIDs, minors and bus ids stay the host's.
struct VisibleDevices {
  std::vector<unsigned> gpus;                         // host GPU indexes, ascending
  std::map<unsigned, std::vector<std::string>> migs;  // GPU → visible MIG UUIDs; absent: all
  bool MigVisible(unsigned gpu, const std::string& mig_uuid) const;
};
// nullopt: no restriction. Errors (kInvalidInput) name the entry that matches no device.
Result<std::optional<VisibleDevices>> ParseVisibleDevices(const Fixture& fixture,
                                                          const std::string& spec);

// NVML return code for a name like "DRIVER_NOT_LOADED" or "NVML_ERROR_DRIVER_NOT_LOADED".
std::optional<int> NvmlReturnFromName(const std::string& name);

}  // namespace gpulet::sim
