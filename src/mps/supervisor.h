// MPS control daemons: one `nvidia-cuda-mps-control -d` per MPS-shared resource, supervised.
//
// What the Supervisor guarantees while it runs (between a successful Start and Stop):
//  - each spec's daemon was started with exactly this environment (nothing inherited from the
//    host process): CUDA_VISIBLE_DEVICES=<the spec's GPU UUIDs, comma-separated>,
//    CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY from PathsFor(root, resource), and a
//    fixed PATH (the binary's directory first, then the system directories);
//  - the spec's GPUs are in compute mode EXCLUSIVE_PROCESS (when an Nvml was given);
//  - the daemon was told `set_default_active_thread_percentage ActiveThreadPercentage(replicas)`
//    and, for each GPU i (0..n-1, as the daemon numbers its CUDA_VISIBLE_DEVICES),
//    `set_default_device_pinned_mem_limit i PinnedMemLimit(memory_bytes[i], replicas)`;
//  - every health_interval each daemon is checked: its process is alive AND its control pipe
//    answers a query within command_timeout. A failed check calls listener(resource, false),
//    stops what is left of the daemon (SIGTERM, then SIGKILL after term_grace) and restarts it
//    with exponential backoff (min_backoff, doubling, at most max_backoff); once it is back, with
//    compute mode and defaults re-applied, listener(resource, true).
//  - a daemon already running on a spec's pipe directory for exactly the spec's GPUs (left by an
//    earlier gpulet: an upgrade, a crash) that answers its control pipe is ADOPTED, not quit: the
//    MPS servers of running pods stay up. Its defaults are applied again.
//  - each GPU's compute mode as found before gpulet first set EXCLUSIVE_PROCESS is kept on disk
//    (<root>/compute-modes.json, replaced atomically before the mode changes), so a gpulet that
//    crashed and starts again restores the true original, never its own EXCLUSIVE_PROCESS.
// Update() changes the set of daemons: only those whose spec changed (GPUs, memory, replicas) or
// that are gone are quit; the others keep running untouched.
// Stop() quits every daemon (`quit`, then SIGTERM and SIGKILL), restores each GPU's original
// compute mode, and reaps every process it started. Detach() stops supervising and leaves the
// daemons and compute modes as they are, for the next gpulet to adopt (a restart or upgrade).
//
// Processes: run through common/process.h (no shell, clean signal mask, descriptors above stderr
// closed in the child, killed and reaped on timeout).
// Only the pids it started are waited for; no signal handlers are installed (SIGCHLD stays the
// host's). The daemon itself detaches (`-d`), so it is found through the pid file the control
// program writes in the pipe directory.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "gpu/nvml.h"

namespace gpulet::mps {

struct DaemonSpec {
  std::string resource_name;           // "nvidia.com/gpu.shared"; one daemon per MPS resource
  std::vector<std::string> gpu_uuids;  // physical GPUs it serves (its CUDA_VISIBLE_DEVICES)
  std::vector<unsigned> gpu_indices;   // parallel to gpu_uuids (NVML indexes, for compute mode)
  std::vector<uint64_t> memory_bytes;  // parallel: each GPU's total memory
  int replicas = 2;                    // per GPU
};

struct DaemonPaths {
  std::string pipe_dir, log_dir, shm_dir;
};

// <root>/<resource name with '/' → '_'>/{pipe,log}; shm_dir = <root>/shm. Pure.
DaemonPaths PathsFor(const std::string& root, const std::string& resource_name);

// 100 / replicas (integer division), at least 1; replicas < 1 counts as 1.
int ActiveThreadPercentage(int replicas);

// "<MiB>M": memory_bytes / replicas, rounded down to whole MiB; replicas < 1 counts as 1.
std::string PinnedMemLimit(uint64_t memory_bytes, int replicas);

// The pid file the control daemon writes in its pipe directory.
std::string PidFilePath(const DaemonPaths& paths);

struct SupervisorOptions {
  std::string control_binary = "nvidia-cuda-mps-control";  // a path, or a name looked up in PATH
  std::string root = "/run/nvidia/mps";
  std::chrono::milliseconds health_interval{1000};
  std::chrono::milliseconds min_backoff{500};
  std::chrono::milliseconds max_backoff{30000};
  // Added beyond the agreed API: how long one control command (a client run) may take before
  // it is killed and counts as failed, and how long Stop waits for `quit` before SIGKILL.
  std::chrono::milliseconds command_timeout{5000};
  std::chrono::milliseconds stop_timeout{5000};
  // After SIGTERM, how long a daemon has to exit before SIGKILL.
  std::chrono::milliseconds term_grace{2000};
};

// Where the GPUs' original compute modes are kept: <root>/compute-modes.json.
std::string ComputeModesPath(const std::string& root);

// The result of running the control program once.
struct ControlOutput {
  int exit_code = 0;  // 128+N when killed by signal N
  std::string out;    // stdout and stderr, interleaved
};

class Supervisor {
 public:
  using HealthListener = std::function<void(const std::string& resource_name, bool healthy)>;

  // nvml may be null (then compute modes are not touched). `clock` times the health checks and
  // the restart backoff (a test passes a FakeClock); commands keep real-time timeouts.
  Supervisor(SupervisorOptions options, std::shared_ptr<gpu::Nvml> nvml,
             Clock& clock = RealClock());
  ~Supervisor();  // Stop()
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts one daemon per spec, sets EXCLUSIVE_PROCESS on their GPUs, configures the defaults,
  // then health-checks continuously on its own thread, restarting a dead daemon with backoff.
  // `listener` is called (from the supervisor thread, never with a lock held) on every health
  // change; not for the initial healthy state. It must not call Stop() (Stop joins that thread). A
  // healthy daemon left running for the same GPUs (by an earlier gpulet) is adopted; one for
  // other GPUs, or one that does not answer, is stopped and replaced. Errors
  // (nothing is left running and compute modes are restored): kInvalidInput for a bad spec (names
  // the resource and field) or a root where the directories cannot be made (names the path);
  // kNotFound when the control binary does not exist (names it); kUnavailable when a daemon does
  // not start or does not take its defaults; kNvmlError when a compute mode cannot be read or set.
  // Start may be called once (kInternal afterwards).
  Status Start(std::vector<DaemonSpec> specs, HealthListener listener);

  // Changes the daemons to `specs` (validated as for Start): quits the daemons of resources
  // that are gone or whose spec changed and starts their replacements; the others are left
  // running, untouched. Compute modes of GPUs no spec uses any more are restored. kInternal when
  // not started. On error the failed resource is left down (the loop retries it with backoff).
  Status Update(std::vector<DaemonSpec> specs);

  // Quits every daemon, restores the previous compute modes. Idempotent; thread-safe.
  void Stop();

  // Stops supervising without touching the daemons or the compute modes (they are the next
  // gpulet's to adopt). Stop() afterwards does nothing. Idempotent; thread-safe.
  void Detach();

  // Whether the resource's daemon passed its last check. False for unknown resources and
  // after Stop.
  bool Healthy(const std::string& resource_name) const;

  // The pid of the resource's running daemon (from its pid file), or -1. For tests and logs.
  int DaemonPid(const std::string& resource_name) const;

  // Runs the control program as a client for `resource_name`'s daemon with `commands` (one per
  // line) on stdin, in the daemon's environment. kNotFound for an unknown resource,
  // kUnavailable on timeout (the client is killed).
  Result<ControlOutput> Control(const std::string& resource_name,
                                const std::vector<std::string>& commands) const;

 private:
  struct Daemon;

  Status StartDaemon(Daemon& d);  // compute mode, launch, defaults
  Status ApplyDefaults(Daemon& d);
  bool AdoptDaemon(Daemon& d);  // a healthy daemon for the same GPUs already runs: keep it
  bool CheckDaemon(const Daemon& d) const;
  void KillDaemon(Daemon& d);
  void QuitDaemon(Daemon& d);
  void Loop(StopSignal& stop);
  void StartLoop();
  Result<ControlOutput> RunControl(const Daemon& d, const std::vector<std::string>& args,
                                   const std::vector<std::string>& commands) const;
  Status SetExclusive(Daemon& d);
  // Restores the original modes of the GPUs in `uuids` (all when empty) and forgets them.
  void RestoreComputeModes(const std::set<std::string>& keep = {});
  Status SaveModes();
  Result<std::unique_ptr<Daemon>> MakeDaemon(DaemonSpec spec) const;
  void StopLoop();  // joins the health thread (mu_ must not be held)

  SupervisorOptions options_;
  std::shared_ptr<gpu::Nvml> nvml_;
  Clock& clock_;
  std::string binary_;  // resolved absolute path
  HealthListener listener_;
  std::vector<std::unique_ptr<Daemon>> daemons_;
  // GPU UUID → (NVML index, compute mode before gpulet first changed it); mirrored on disk.
  std::map<std::string, std::pair<unsigned, int>> saved_modes_;

  mutable std::mutex mu_;  // guards the fields below and each Daemon's `healthy`
  bool started_ = false;
  bool stopping_ = false;
  std::unique_ptr<StopSignal> loop_stop_;  // ends the health thread (Stop, Detach, an Update)
  std::thread thread_;
  std::mutex stop_mu_;  // serialises Stop()
};

}  // namespace gpulet::mps
