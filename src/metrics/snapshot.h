// One collection of every configured field for every GPU (or MIG GPU instance): an immutable
// value produced by the collector thread and rendered by scrapes. Nothing in it refers back to
// NVML, so a snapshot outlives the session that produced it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "metrics/counters.h"

namespace gpulet::metrics {

struct Value {
  bool is_double = false;
  int64_t i = 0;
  double d = 0;
  static Value Int(int64_t v) { return {false, v, 0}; }
  static Value Double(double v) { return {true, 0, v}; }
};

// Identifies the thing a series describes: a whole GPU (gpu_instance_id < 0) or one MIG GPU
// instance of it. Pod attribution maps device IDs to these keys.
struct EntityKey {
  unsigned gpu = 0;
  int gpu_instance_id = -1;
  auto operator<=>(const EntityKey&) const = default;
};

// The identity labels dcgm-exporter puts on every series of a physical GPU.
struct GpuIdentity {
  unsigned index = 0;
  std::string uuid;
  std::string pci_bus_id;
  std::string model;
};

// One compute process on an entity (metrics/processes.h), with the pod its cgroup names.
struct ProcessUse {
  uint32_t pid = 0;
  uint64_t used_bytes = 0;
  bool has_memory = false;  // NVML gave the bytes used
  unsigned sm_util = 0;
  bool has_util = false;  // NVML gave a utilisation sample since the last collection
  std::string pod_uid;    // "" when the process is in no pod's cgroup
  bool operator==(const ProcessUse&) const = default;
};

struct EntitySample {
  EntityKey key;
  GpuIdentity gpu;
  std::string mig_profile;  // non-empty for MIG GPU instances ("1g.10gb")
  // Parallel to counters->metrics; empty optional = not available (unsupported, not on MIG).
  std::vector<std::optional<Value>> values;
  // Parallel to counters->labels.
  std::vector<std::string> labels;
  // DCGM_EXP_XID_ERRORS_COUNT: XID code → count in the window (one series each, label xid).
  std::map<uint64_t, int64_t> xid_counts;
  // Compute processes (only with --kubernetes-virtual-gpus). processes_read: NVML listed them.
  bool processes_read = false;
  std::vector<ProcessUse> processes;
};

struct GpuHealth {
  GpuIdentity gpu;
  bool up = true;      // false: NVML reported the GPU lost during this collection
  std::string reason;  // why it is down
};

struct Snapshot {
  std::shared_ptr<const CounterSet> counters;
  std::string hostname;
  bool simulated = false;              // the driver is gpulet's simulated one (a fixture)
  std::vector<EntitySample> entities;  // lost GPUs contribute none
  std::vector<GpuHealth> gpus;         // every GPU of the inventory, in index order
  int64_t collected_at_ms = 0;         // wall clock, for logs and /health
};

struct PodRef {
  std::string namespace_;
  std::string pod;
  std::string container;
  std::string vgpu;  // the replica of a shared GPU ("3" of "GPU-…::3"); "" for whole devices
  std::string uid;   // the pod's UID when known (API server), else ""
  // A device allocated through DRA: the claim and the allocation result's driver, pool and
  // device, as the pod-resources API lists them (labels dra_claim_name, dra_claim_namespace,
  // dra_driver_name, dra_pool_name, dra_device_name, as dcgm-exporter names them); "" otherwise.
  std::string dra_claim_name;
  std::string dra_claim_namespace;
  std::string dra_driver_name;
  std::string dra_pool_name;
  std::string dra_device_name;
  bool operator==(const PodRef&) const = default;
};

// Which containers hold each entity, one PodRef per container and replica (a GPU shared by
// time-slicing or MPS has several; metrics/pod_resources.h).
using PodMap = std::map<EntityKey, std::vector<PodRef>>;

}  // namespace gpulet::metrics
