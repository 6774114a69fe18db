// The control state of a simulated node: what `gpulet sim` changed (overrides, lost GPUs, extra
// ECC errors, compute modes) and the events it queued. It lives in <state_dir>/control.json and
// is shared by every process using the node:
//   - writers do read-modify-write under flock(<state_dir>/control.lock) and replace the file
//     with rename(), so a reader never sees half a file and never needs the lock;
//   - readers notice a change by the file's identity (inode, mtime, size) changing, or by
//     inotify on the state directory (event waits).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "sim/sim_process.h"

namespace gpulet::sim {

// gpuInstanceId / computeInstanceId of an event not tied to a MIG device.
inline constexpr unsigned kNoInstance = 0xFFFFFFFFu;

struct GpuOverrides {
  std::optional<unsigned> temperature_c;
  std::optional<unsigned> gpu_util;  // percent
  std::optional<unsigned> mem_util;  // percent
  std::optional<unsigned> power_w;
  std::optional<uint64_t> memory_used_mib;
  std::optional<int> compute_mode;  // nvmlComputeMode_t
  bool lost = false;
  uint64_t ecc_single_bit = 0;  // added to the simulated corrected-error counters
  uint64_t ecc_double_bit = 0;  // added to the uncorrected-error counters
};

struct SimEvent {
  uint64_t seq = 0;  // increases by one per queued event, never reused
  unsigned gpu = 0;
  uint64_t type = 0;  // nvmlEventType* bit
  uint64_t data = 0;  // the XID for XidCriticalError
  unsigned gpu_instance = kNoInstance;
  unsigned compute_instance = kNoInstance;
};

// One GPU instance of a GPU's live MIG layout, with the ids of its compute instances.
struct MigInstanceState {
  unsigned gi = 0;
  std::string profile;     // a fixture mig_profiles name: "3g.20gb"
  unsigned placement = 0;  // start, in memory slices
  std::vector<unsigned> cis;
  bool operator==(const MigInstanceState&) const = default;
};

// A GPU's MIG layout once something (nvmlDeviceSetMigMode, instance create/destroy) changed it;
// until then the fixture's `mig:` list is the layout.
struct MigLayoutState {
  bool enabled = false;
  std::vector<MigInstanceState> instances;  // ordered by gi
  bool operator==(const MigLayoutState&) const = default;
};

struct ControlState {
  uint64_t next_seq = 1;
  std::map<unsigned, GpuOverrides> gpus;
  std::deque<SimEvent> events;  // the newest kMaxEvents
  std::map<unsigned, MigLayoutState> mig;  // by GPU index; absent: the fixture's layout
  // Fault hook: when > 0, counts down on every GPU- or compute-instance create; the create that
  // brings it to 0 fails with NVML_ERROR_INSUFFICIENT_RESOURCES (1: the next create fails).
  unsigned mig_create_fail_countdown = 0;
  // Compute processes by GPU index, replacing the fixture's `processes:` of that GPU (an empty
  // list: no processes). Absent: the fixture's.
  std::map<unsigned, std::vector<SimProcess>> processes;

  // Every writer and every reader parses the whole file, so the queue stays short: an event set
  // that falls more than this many events behind misses the oldest ones.
  static constexpr size_t kMaxEvents = 256;

  const GpuOverrides* Find(unsigned gpu) const {
    auto it = gpus.find(gpu);
    return it == gpus.end() ? nullptr : &it->second;
  }
  // Appends an event with the next sequence number, dropping the oldest beyond kMaxEvents.
  void Queue(SimEvent event);
};

std::string ControlStateToJson(const ControlState& state, int indent = -1);
// Errors: kInvalidInput naming `source` and the field.
Result<ControlState> ControlStateFromJson(const std::string& text, const std::string& source);

class ControlFile {
 public:
  explicit ControlFile(std::string state_dir);

  const std::string& state_dir() const { return dir_; }
  std::string path() const { return dir_ + "/control.json"; }

  // The current state; a missing file is the empty state.
  Result<ControlState> Read() const;
  // Read-modify-write under the lock; the new file replaces the old atomically.
  Result<ControlState> Update(const std::function<void(ControlState&)>& change) const;

 private:
  std::string dir_;
};

// Cheap change detection for a reader that polls: Changed() is one stat().
class ControlFileWatch {
 public:
  explicit ControlFileWatch(std::string path) : path_(std::move(path)) {}
  // True when the file appeared, disappeared or was replaced since the last call (the first call
  // is true).
  bool Changed();

 private:
  std::string path_;
  bool first_ = true;
  bool existed_ = false;
  ino_t ino_ = 0;
  int64_t mtime_ns_ = 0;
  off_t size_ = 0;
};

}  // namespace gpulet::sim
