// The node's Preparer (preparer.h): what a claim's allocation means on this node's GPUs.
//
// Prepare(claim), for this driver's results in allocation order:
//   gpu-N          the GPU's CDI edits: /dev/nvidia<minor>, the control nodes, the driver's
//                  libraries and binaries under driver_root, an ldconfig hook (cdi.h); or, where the
//                  host has nvidia-ctk's spec (kind nvidia.com/gpu), a reference to its device for
//                  this GPU (by UUID, else by index) instead of edits of our own.
//   gpu-N-mem      the GPU as above plus a memory limit: consumed["memory"] bytes become a
//                  libgpulet-cuda limit keyed by the GPU's UUID, in a per-claim directory
//                  <state_dir>/limits/<claim uid>/ made by cudashim/limits_dir.h (the device
//                  plugin's machinery); the spec mounts the library, the read-only limits file, the
//                  tenant's cuda/ region directory and the preload. Shares of one GPU in one claim
//                  add up. A container should hold one memory-limited claim (the library reads one
//                  limits file).
//   gpu-N-mig-<slug>-<start>
//                  a MIG device created now (that profile at that placement start, one compute
//                  instance spanning it; MIG mode enabled first if it was off) under the MIG
//                  layout lock (mig/layout_lock.h), destroyed at Unprepare (and MIG mode turned
//                  off again if this claim turned it on and the GPU has no instance left). Its
//                  edits carry the parent's node and the GPU/compute instance capability nodes.
// Opaque configs (opaque_config.h) choose time-slicing or MPS per request; MPS goes through
// `mps` (below).
//
// The CDI spec is <cdi_root>/gpu.gpulet.io-claim_<uid>.json (kind gpu.gpulet.io/claim, device
// names "<uid>-<device>"), written atomically before Prepare returns, at the lowest cdiVersion
// covering its fields. A per-claim record <state_dir>/claims/<uid>.json (the record_json
// returned) makes Prepare idempotent across restarts: the same claim UID gets the same devices
// back, nothing is made twice.
//
// All or nothing: a step that fails undoes every step before it (MIG devices destroyed, limit
// directory and spec removed) before Prepare returns the error, which names the claim, the device
// and the cause. Unprepare works from record_json alone (claim deleted, agent restarted), also
// removes what a Prepare interrupted by a crash may have left under the claim's fixed names, and
// succeeds when nothing is left.
//
// Thread-safe: calls for one node are serialised inside (Prepare is milliseconds without MIG).
//
// Library: gpulet_dra_prepare (src/dra/prepare.cmake).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "dra/preparer.h"
#include "gpu/inventory.h"
#include "gpu/nvml.h"
#include "mig/plan.h"

namespace gpulet::dra {

// Set in every prepared claim's CDI spec: the claim's devices as "<device>=<UUID>" (a MIG device's
// own UUID), comma-separated, e.g. "gpu-3=GPU-…,gpu-1-mig-1g-10gb-0=MIG-…". `gpulet slurm pod`
// reads it (src/slurm) to write gres.conf from a DRA allocation.
inline constexpr char kDevicesEnv[] = "GPULET_DRA_DEVICES";

// What an MPS-shared device needs from a control daemon (one per claim and device set).
struct MpsRequest {
  std::string claim_uid;
  std::vector<std::string> gpu_uuids;  // physical GPUs (a MIG device's parent)
  std::vector<unsigned> gpu_indices;
  std::vector<uint64_t> memory_bytes;  // each GPU's total memory
  int active_thread_percentage = 0;    // 0: the daemon's default
  uint64_t pinned_memory_bytes = 0;    // per GPU; 0: no limit
};
// Host directories of the daemon serving a request (mps::DaemonPaths' pipe and shm).
struct MpsDaemonDirs {
  std::string pipe_dir;
  std::string shm_dir;
};
// Starts / stops per-claim MPS control daemons (dra/mps_control.h: SupervisorMpsControl, through
// mps::Supervisor).
class MpsControl {
 public:
  virtual ~MpsControl() = default;
  virtual Result<MpsDaemonDirs> Start(const MpsRequest& request) = 0;
  // Idempotent; OK when no daemon runs for the claim.
  virtual Status Stop(const std::string& claim_uid) = 0;
};

struct NodePreparerOptions {
  std::string node_name;
  // The node's GPUs as discovered at start (index, UUID, minor, memory, MIG capability).
  gpu::Inventory inventory;
  // The driver, for dynamic MIG (create/destroy, and reading the new device's UUID and capability
  // nodes back with `discover`). May be null: MIG devices are then refused (kUnavailable).
  std::shared_ptr<gpu::Nvml> nvml;
  gpu::DiscoverOptions discover;
  // The MIG layout lock shared with `gpulet mig apply`; empty: mig::LayoutLockPath("").
  std::string mig_lock_file;

  // CDI: where the per-claim specs go.
  std::string cdi_root = "/var/run/cdi";
  // Where the driver's files are looked up (libraries, binaries, /dev nodes), and the same root as
  // the container runtime on the host sees it (the spec's host paths; empty: driver_root). They
  // differ when the agent runs in a container with the host's root mounted elsewhere.
  std::string driver_root = "/";
  std::string host_driver_root;
  // Directories searched for nvidia-ctk's own spec (kind nvidia.com/gpu); empty: never refer to it.
  std::vector<std::string> nvidia_spec_dirs = {"/etc/cdi", "/var/run/cdi"};
  // The createContainer hook that refreshes the container's ld cache: nvidia-ctk's
  // nvidia-cdi-hook when found under driver_root (usr/bin, usr/local/bin) or here; empty and none
  // found: no hook (the libraries are also mounted at their soname paths, so none is needed).
  std::string cdi_hook_binary;

  // The preparer's own directory: claims/<uid>.json records, limits/<uid>/ memory-limit dirs.
  // Not the device plugin's memory-limit state directory (its janitor owns that one). On tmpfs
  // like /var/run/cdi: everything here ends at a reboot, as the MIG devices and the transient
  // specs do (and the plugin's checkpoint, by boot ID); an agent restart keeps it.
  std::string state_dir = "/run/gpulet/dra";
  // Memory shares: host path of libgpulet-cuda.so (empty: shares are refused, kUnavailable) and
  // the node's pass-through choice (the library counts, never refuses).
  std::string cuda_library;
  bool memory_passthrough = false;

  // MPS daemons; null: an MPS config is refused (kUnavailable) naming the claim and config.
  std::shared_ptr<MpsControl> mps;
};

// Errors (kInvalidInput) for options that cannot work: an empty state_dir or cdi_root, a
// relative path.
Result<std::unique_ptr<Preparer>> MakeNodePreparer(NodePreparerOptions options);

// Removes from `state` the MIG instances this driver made for claims (those its per-claim
// records under `state_dir` hold), so that after a restart the slice builder does not read them
// as a static layout: their placements stay published (the claims holding them keep the GPU's
// counters), and the whole GPU too. Records that cannot be read are skipped (logged). Returns how
// many instances were removed.
size_t ForgetDraMadeMigInstances(const std::string& state_dir, std::vector<mig::GpuState>& state);

}  // namespace gpulet::dra
