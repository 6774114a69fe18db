// The node's ResourceSlices (resource.k8s.io/v1) for driver gpu.gpulet.io: a pure function of the
// inventory, the MIG geometry, health and the placement policy. No I/O (publisher.h writes them).
//
// One pool per node (pool name = node name, spec.nodeName = node, an owner reference to the Node
// so the slices go with it). Devices (names from names.h):
//   gpu-N            the whole GPU: attributes type=gpu, uuid, productName, architecture,
//                    cudaComputeCapability and driverVersion (versions),
//                    the standard attributes of Kubernetes 1.37 (k8s.io/dynamic-resource-
//                    allocation/deviceattribute; docs/dra.md): resource.kubernetes.io/pciBusID
//                    (string, "0000:18:00.0"), resource.kubernetes.io/pcieRoot (string,
//                    "pci0000:17", when sysfs names it), resource.kubernetes.io/numaNode (int,
//                    the scalar form, when the GPU has NUMA affinity), each left out when its
//                    value would not be in upstream's form; nvlinkDomain (see below); capacity
//                    memory. gpu-N-mem and the MIG devices carry the same (the parent's).
//   gpu-N-mem        the GPU's memory as consumable capacity (KEP-5075): allowMultipleAllocations,
//                    capacity memory = whole units of memory_unit_bytes, requestPolicy
//                    {default: one unit, validRange {min: one unit, step: one unit}}, so a request
//                    is rounded up to whole units and several claims share the GPU.
//   gpu-N-mig-P-S    one device per MIG profile P and placement start S the GPU offers
//                    (mig::GpuState profiles; a GPU without MIG publishes none), created at
//                    Prepare: type=mig, profile, parentUUID, parent attributes; capacity memory
//                    and multiprocessors-equivalent compute slices.
//
// Shared counters (KEP-4815): every GPU has a counter set "gpu-N-counters" with
//   memory-slice-<i> = 1 for each MIG memory slice (MIG-capable GPUs),
//   compute-slices   = the GPU's compute slices (7 on A100/H100/H200; 1 without MIG),
//   media-engines    = 1 (the one set of decoders/JPEG/OFA a "+me" profile takes; MIG GPUs).
// gpu-N consumes all of it; each MIG placement consumes its memory slices [S, S+size), its
// compute slices, and media-engines when it is a "+me" profile; so a GPU and any MIG device of
// it, or two overlapping placements, can never both be allocated. gpu-N-mem also consumes all of
// it: a device with allowMultipleAllocations pays its counters once, while it holds any share,
// not once per share (the structured allocator skips the counter check for a multi-allocatable
// device already in use: `skipCounterCheck := allowMultipleAllocations &&
// deviceCapacityInUse(...)` in the incubating/experimental allocators; per-share, request-sized
// counter use is what KEP-5941 adds later). Hence any number of memory shares coexist (the
// device's memory capacity bounds them), and a share excludes the whole GPU and every MIG device
// of that GPU, in either order. Schedulers before kubernetes#139040 (counters of committed shares
// forgotten in the next cycle) and #140437 (a persisted share charged again, refusing the next
// share with "Insufficient counters") get this combination wrong; both are fixed upstream.
//
// Layout within the API limits (dra.md 2.1; 1.35+: a slice holds devices or sharedCounters, not
// both; 64 devices per slice when any uses counters or taints; 8 counter sets per slice):
//   <prefix>-c<NN>  counter slices, 8 GPUs' sets each
//   <prefix>-d<NN>  device slices: the whole GPUs, then the memory-share devices, then the MIG
//                   placements, each kind packed in order, at most 64 devices per slice, a new
//                   slice where a kind starts
// where <prefix> is "<node>-gpu.gpulet.io" (the node name shortened with a hash when the name
// would pass 253 characters). Slice names sort in this order, and the scheduler's allocator
// takes the first fit in slice-name then device order (dra.md 1.6), so the device order is the
// allocation preference.
//
// Device order follows a placement policy (src/placement, the same code `gpulet replay` scores
// with; issue 25 item 5): whole GPUs in the order the policy would hand single whole-GPU pods
// one after another on this node; memory shares and MIG placements in the order it would place
// successive sharing pods, each on a GPU not yet chosen. With the current usage (per-GPU milli
// used, SliceInputs::gpu_used_milli) the order follows it: bestfit puts the fullest GPU that
// still fits first, so shares pack. Inside one GPU, MIG placements go by profile (as the GPU
// lists them) and then by start, lowest first (so small instances pack from slice 0).
//
// Health: every device of a GPU that is unhealthy (a counted XID, double-bit ECC, lost) carries
// a NoSchedule taint "gpu.gpulet.io/unhealthy" whose value names why ("xid-79", "gpu-is-lost")
// and whose timeAdded is when gpulet first saw it; a healthy GPU has none.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "gpu/inventory.h"
#include "mig/plan.h"

namespace gpulet::dra {

inline constexpr char kUnhealthyTaintKey[] = "gpu.gpulet.io/unhealthy";
inline constexpr size_t kMaxDevicesPerSlice = 64;  // with counters or taints in use
inline constexpr size_t kMaxCounterSetsPerSlice = 8;

struct SliceOptions {
  std::string node_name;
  std::string node_uid;  // the Node's metadata.uid for the owner reference; empty: none
  int64_t memory_unit_bytes = int64_t{1} << 30;  // gpu-N-mem's step; 1Gi
  // A src/placement policy name (placement::PolicyNames()); "bestfit" by default.
  std::string placement_policy = "bestfit";
  // Where /sys is, for pcieRoot (the PCI root of /sys/bus/pci/devices/<bus id>).
  std::string sysfs_root = "/sys";
  bool publish_memory_shares = true;
  bool publish_mig = true;
};

// Why a GPU is tainted.
struct GpuTaint {
  std::string reason;  // the health reason ("XID 79", "GPU is lost")
  std::chrono::system_clock::time_point since;
};

struct SliceInputs {
  const gpu::Inventory* inventory = nullptr;
  // Per GPU (by index): its MIG profiles and placements. A GPU missing here, or with no profiles,
  // or not mig_capable in the inventory, publishes no MIG devices. `instances` are placements
  // held outside DRA (a static `gpulet mig apply` layout): placements overlapping them are not
  // published, nor are the whole GPU and its memory share while any exists.
  std::vector<mig::GpuState> mig;
  std::map<std::string, GpuTaint> taints;  // by GPU UUID
  // Milli-GPU in use per GPU index (0..1000), for the device order; empty: all free.
  std::vector<int32_t> gpu_used_milli;
};

// The node's slices, each a complete resource.k8s.io/v1 ResourceSlice object (apiVersion, kind,
// metadata.name and ownerReferences, spec) with pool.generation = `generation` and
// pool.resourceSliceCount = the number of slices returned. Errors: kInvalidInput for an empty node
// name, a missing inventory, a unit <= 0 or an unknown policy.
Result<std::vector<nlohmann::json>> BuildSlices(const SliceInputs& inputs,
                                                const SliceOptions& options, int64_t generation);

// The GPU indices in the order the policy would hand whole GPUs (`whole`) or shares to pods on
// this node, one GPU after another (see the file comment).
Result<std::vector<unsigned>> PolicyGpuOrder(const gpu::Inventory& inventory,
                                             const std::vector<int32_t>& used_milli,
                                             const std::string& policy, bool whole);

// NVLink domains: GPUs joined by NVLink (directly or through others) share a domain, numbered by
// the lowest GPU index in it; a GPU without NVLink has none (nullopt), so matchAttribute on it
// never matches.
std::vector<std::optional<int64_t>> NvlinkDomains(const gpu::Inventory& inventory);

// "550.54.15" → "550.54.15", "535.104.05" → "535.104.5", "12.4" → "12.4.0", "9.0" → "9.0.0":
// a semantic version as the API's version attributes require; nullopt when not numeric.
std::optional<std::string> SemverOf(const std::string& version);

// NVML's "00000000:18:00.0" → "0000:18:00.0": the standard pciBusID attribute's form, extended
// BDF in lower case ("dddd:bb:dd.f", what deviceattribute.GetPCIBusIDAttribute accepts); nullopt
// for anything else, including a domain above ffff, which that form cannot carry.
std::optional<std::string> PciBusId(const std::string& nvml_bus_id);

// The PCIe root complex ("pci0000:17") of the device with standard bus id `bus_id`, resolved as
// deviceattribute.GetPCIeRootAttributeByPCIBusID does: the relative /sys/bus/pci/devices/<bus id>
// link must lead to devices/pci…/…/<bus id>, and the root is the component under devices/.
// nullopt when sysfs does not say.
std::optional<std::string> PcieRoot(const std::string& sysfs_root, const std::string& bus_id);

// A quantity of bytes in the API server's canonical form ("80Gi", "81559Mi", "1500").
std::string BytesQuantity(int64_t bytes);

}  // namespace gpulet::dra
