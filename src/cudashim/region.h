// The accounting region: one small file per container (<dir>/memory.region), mapped shared by every
// process of the container that uses CUDA, by the device plugin that creates it, and by the
// exporter that reads it. It holds each GPU's limit and use, and each process's share of that use,
// so a process that dies (SIGKILL included) gives its memory back to the others.
//
// Layout (version 1, native endianness, fixed size): a header (magic "GPULETMR", layout version,
// sizes), a process-shared robust mutex, kMaxGpus GPU slots (UUID, limit, use, measured context
// size) and kMaxProcesses process slots (pid, start time, use per GPU). A reader refuses a file of
// another version or size with an error that says so; nothing is ever written to such a file.
//
// Consistency: every change of a GPU's use happens under the mutex, together with the change of
// the owning process's share; a GPU's use is always the sum of its live process shares. A process
// killed inside the critical section leaves the mutex to the next locker (robust mutex), which
// rebuilds every GPU's use from the process slots before going on. Dead owners are found by pid
// and the process start time (/proc/PID/stat field 22), so a reused pid is not mistaken for the
// owner. Processes of different users share the file: it is created with mode 0666 whatever the
// umask.
//
// Nothing here allocates after Open, throws, or uses anything beyond libc: the interposer calls it
// from inside CUDA entry points.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace gpulet::cudashim {

inline constexpr char kRegionMagic[8] = {'G', 'P', 'U', 'L', 'E', 'T', 'M', 'R'};
inline constexpr uint32_t kRegionVersion = 1;
inline constexpr uint32_t kMaxGpus = 16;
inline constexpr uint32_t kMaxProcesses = 1024;
inline constexpr uint32_t kUuidBytes = 80;
inline constexpr const char* kRegionFileName = "memory.region";

struct GpuSlot {
  char uuid[kUuidBytes];  // "GPU-…", NUL-terminated; empty: unused slot
  uint64_t limit;         // bytes the container may hold on this GPU
  std::atomic<uint64_t> used;
  std::atomic<uint64_t> peak;
  // Device memory one CUDA context takes on this GPU: 0 until the first process measures it (or
  // the plugin sets it); every later context is charged this before the driver creates it.
  std::atomic<uint64_t> context_bytes;
  uint64_t reserved[4];
};

enum ProcessState : uint32_t { kSlotFree = 0, kSlotClaiming = 1, kSlotLive = 2 };

struct ProcessSlot {
  std::atomic<uint32_t> state;
  int32_t pid;
  uint64_t start_time;  // clock ticks after boot, /proc/PID/stat field 22
  std::atomic<uint64_t> used[kMaxGpus];
};

struct RegionHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;  // sizeof(RegionHeader)
  uint32_t max_gpus;
  uint32_t max_processes;
  uint32_t gpu_count;
  uint32_t reserved0;
  uint64_t file_bytes;
  pthread_mutex_t mutex;  // process-shared, robust
  char pad[64];
};

struct RegionLayout {
  RegionHeader header;
  GpuSlot gpus[kMaxGpus];
  ProcessSlot processes[kMaxProcesses];
};

// What the plugin writes for one GPU.
struct GpuLimit {
  std::string uuid;
  uint64_t limit = 0;
  uint64_t context_bytes = 0;  // 0: measured by the first process
};

// What a reader (exporter, tests) sees of one GPU.
struct GpuUsage {
  std::string uuid;
  uint64_t limit = 0;
  uint64_t used = 0;
  uint64_t peak = 0;
  uint64_t context_bytes = 0;
};

// Creates <dir>/memory.region for `gpus` (at most kMaxGpus), mode 0666, atomically (a temporary
// file renamed into place; an existing region is replaced only when `replace`). Returns "" or an
// error naming the file and the cause.
std::string CreateRegion(const std::string& dir, const std::vector<GpuLimit>& gpus,
                         bool replace = false);

// Liveness of a process slot's owner: exists, is not a zombie, and started at `start_time`.
bool OwnerAlive(int32_t pid, uint64_t start_time);
// Field 22 of /proc/PID/stat (0 when unreadable) and whether the process is a zombie.
uint64_t ProcessStartTime(pid_t pid, bool* zombie = nullptr);

class Region {
 public:
  Region() = default;
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // Maps <dir>/memory.region read-write (read-only when `read_only`: the exporter). Returns "" or
  // an error naming the file and the cause (missing, permissions, wrong magic, another layout
  // version, wrong size).
  std::string Open(const std::string& dir, bool read_only = false);
  bool is_open() const { return layout_ != nullptr; }
  const std::string& path() const { return path_; }

  // The slot of GPU `uuid` ("GPU-…"), or -1.
  int FindGpu(const char* uuid) const;
  uint32_t gpu_count() const;
  const GpuSlot& gpu(int slot) const { return layout_->gpus[slot]; }
  GpuSlot& gpu(int slot) { return layout_->gpus[slot]; }

  // Claims this process's slot (pid + start time), reaping dead owners first. Returns the slot
  // index, or -1 when every slot is held by a live process. Call again after fork().
  int Attach();

  // Adds `bytes` to process slot `proc` and GPU `gpu` if the GPU's use stays within its limit.
  // With `force`, adds even past the limit (a size the driver chose after the fact). When the
  // first try fails, dead owners are reaped and it tries once more.
  bool Admit(int proc, int gpu, uint64_t bytes, bool force = false);
  // Returns `bytes` (at most what the process holds on the GPU).
  void Release(int proc, int gpu, uint64_t bytes);
  // Returns everything process slot `proc` holds on `gpu` (a context reset).
  void ReleaseAll(int proc, int gpu);
  // Frees the slots of dead owners and rebuilds every GPU's use. Returns the number reaped.
  int Reap();

  std::vector<GpuUsage> Usage() const;

 private:
  bool Lock();  // false if the lock could not be taken
  void Unlock();
  void RebuildLocked();
  int ReapLocked();

  std::string path_;
  RegionLayout* layout_ = nullptr;
  size_t mapped_ = 0;
  bool read_only_ = false;
};

}  // namespace gpulet::cudashim
