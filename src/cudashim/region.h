// The accounting region: one small file per container (<dir>/memory.region), mapped shared by every
// process of the container that uses CUDA, and read (copied, never mapped) by the exporter. It
// holds each GPU's use and each process's share of that use, so a process that dies (SIGKILL
// included) gives its memory back to the others.
//
// The region is the tenant's: the container writes it, and a container that is root in its
// directory can write anything into it. So it holds usage only. What the device plugin decides
// (each GPU's limit, which GPUs, pass-through) is in the *limits file* (WriteLimitsFile), which the
// container can only read: the plugin mounts it read-only beside the library
// (/usr/lib/gpulet/gpulet-cuda.limits), and the library finds it there (LimitsFileBesideLibrary),
// never through the environment. A process loads it once into private memory (Region::LoadLimits):
// rewriting the region, its old limit field included, changes no limit.
//
// Layout (version 2, native endianness, fixed size): a header (magic "GPULETMR", layout version,
// sizes), a process-shared robust mutex, kMaxGpus GPU slots (UUID, use, peak, measured context
// size) and kMaxProcesses process slots (pid, start time, use per GPU). A reader refuses a file of
// another version or size with an error that says so; nothing is ever written to such a file.
// Version 1 kept the limit in the GPU slot; version 2 keeps the field, writes 0 and never reads it.
//
// Consistency: every change of a GPU's use happens under the mutex, together with the change of
// the owning process's share; a GPU's use is always the sum of its live process shares. A process
// killed inside the critical section leaves the mutex to the next locker (robust mutex), which
// rebuilds every GPU's use from the process slots before going on. Dead owners are found by pid
// and the process start time (/proc/PID/stat field 22), so a reused pid is not mistaken for the
// owner. Processes of different users share the file: it is created with mode 0666 whatever the
// umask. Every index into the mapping comes from the private limits copy (or the constants),
// never from a field the tenant can write.
//
// Nothing here allocates after Open, throws, or uses anything beyond libc: the interposer calls it
// from inside CUDA entry points.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace gpulet::cudashim {

inline constexpr char kRegionMagic[8] = {'G', 'P', 'U', 'L', 'E', 'T', 'M', 'R'};
inline constexpr uint32_t kRegionVersion = 2;
inline constexpr uint32_t kMaxGpus = 16;
inline constexpr uint32_t kMaxProcesses = 1024;
inline constexpr uint32_t kUuidBytes = 80;
inline constexpr const char* kRegionFileName = "memory.region";
inline constexpr char kLimitsMagic[8] = {'G', 'P', 'U', 'L', 'E', 'T', 'M', 'L'};
// Version 1: the limits. Version 2: the same, then the driver library's path (LimitsFile::
// driver_path). A writer writes version 1, byte for byte as before, unless the node names a
// driver; a reader takes either.
inline constexpr uint32_t kLimitsVersion = 2;
inline constexpr uint32_t kLimitsVersionNoDriver = 1;
inline constexpr uint32_t kDriverPathBytes = 512;
inline constexpr const char* kLimitsFileName = "gpulet-cuda.limits";
inline constexpr uint32_t kLimitsPassthrough = 1;  // LimitsFile::flags: do not enforce

struct GpuSlot {
  char uuid[kUuidBytes];  // "GPU-…", NUL-terminated (for people: the limits file is the truth)
  uint64_t unused_limit;  // version 1's limit; 0, never read
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
  // 1 while the owner holds an open-file-description write lock (F_OFD_SETLK) on this slot's
  // first byte. The kernel drops it when the owner's last descriptor of that open file goes (exit,
  // a kill, exec: it is O_CLOEXEC), whatever PID namespace the owner is in and whether /proc can
  // be read: for a locked slot the lock, not the pid, says whether the owner lives.
  std::atomic<uint32_t> locked;
  uint32_t reserved;
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
static_assert(std::is_standard_layout_v<RegionLayout>, "the region is read by offset");

// The limits file: written by the device plugin (mode 0644, owned by the agent), read-only in the
// container. Fixed size; a reader checks magic, version, size and gpu_count before using it.
struct LimitsGpu {
  char uuid[kUuidBytes];  // "GPU-…", NUL-terminated
  uint64_t limit;         // bytes the container may hold on this GPU
  uint64_t reserved[3];
};

struct LimitsFile {
  char magic[8];
  uint32_t version;
  uint32_t file_bytes;  // sizeof(LimitsFile)
  uint32_t gpu_count;   // <= kMaxGpus; slot i of the region is GPU i here
  uint32_t flags;       // kLimitsPassthrough
  uint64_t reserved[4];
  LimitsGpu gpus[kMaxGpus];
};
// What follows a LimitsFile in a version 2 file: the absolute path, in the container, of the
// CUDA driver library the interposer calls (NUL-terminated). A version 1 file ends before it.
struct LimitsDriver {
  char path[kDriverPathBytes];
};
inline constexpr size_t kLimitsFileV2Bytes = sizeof(LimitsFile) + sizeof(LimitsDriver);

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

// Creates <dir>/memory.region for `gpus` (at most kMaxGpus; their UUIDs and context sizes, not
// their limits), mode 0666, atomically (a temporary file renamed into place; an existing region is
// replaced only when `replace`). Returns "" or an error naming the file and the cause.
std::string CreateRegion(const std::string& dir, const std::vector<GpuLimit>& gpus,
                         bool replace = false);

// Writes the limits file `path` for `gpus` (at most kMaxGpus, the region's order), mode 0644,
// atomically. `driver_path` (absolute, shorter than kDriverPathBytes) names the driver library
// the interposer must call; empty, the file is version 1 (sizeof(LimitsFile)) and the library
// uses its fixed list (DriverLibraryCandidates). Returns "" or an error naming the file and the
// cause.
std::string WriteLimitsFile(const std::string& path, const std::vector<GpuLimit>& gpus,
                            bool passthrough = false, const std::string& driver_path = "");
// Reads and checks the limits file `path` into `out`: a regular file (no symlink followed, no
// FIFO waited on) of exactly sizeof(LimitsFile) (version 1) or kLimitsFileV2Bytes (version 2),
// magic, version, gpu_count <= kMaxGpus, every listed UUID non-empty and NUL-terminated, a
// version 2 driver path absolute and NUL-terminated (into *driver when given; empty for version
// 1). Returns "" or an error naming the file and the field.
std::string ReadLimitsFile(const std::string& path, LimitsFile* out,
                           LimitsDriver* driver = nullptr);
// The checks of a copy already read (magic, version, size, gpu_count, UUIDs); `path`
// names it in the error. "" when valid. (The driver path of version 2 is checked by
// ReadLimitsFile.)
std::string CheckLimits(const LimitsFile& f, const std::string& path);
// <directory of the object this code is linked into>/gpulet-cuda.limits: for libgpulet-cuda.so
// in a container, /usr/lib/gpulet/gpulet-cuda.limits. "" when it cannot be found.
std::string LimitsFileBesideLibrary();
// Where the interposer looks for the driver when the limits file names none: the directories the
// NVIDIA container toolkit mounts the host's libcuda.so.1 into, then GKE's driver mount, never
// LD_LIBRARY_PATH.
inline constexpr const char* kDriverLibraryCandidates[] = {
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1", "/usr/lib/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1"};

// The part of a region a reader copies: the header and the GPU slots.
inline constexpr size_t kRegionPrefixBytes = offsetof(RegionLayout, processes);
// Checks a copy of a region's first kRegionPrefixBytes (from a file of `file_bytes`) and returns
// the counters of its GPU slots 0..gpu_count-1 in `out` (uuid from the copy, limit 0). Returns ""
// or what is wrong (magic, version, sizes, gpu_count, a UUID without its NUL). Never reads past
// `bytes`, whatever the copy says.
std::string ParseRegionCopy(const unsigned char* bytes, size_t n, uint64_t file_bytes,
                            std::vector<GpuUsage>* out);

// Whether this process has a descriptor open on a path that starts with `prefix` ("/dev/nvidia":
// the driver's device files), read from /proc/self/fd. False when that cannot be read.
bool DescriptorsOpenUnder(const char* prefix);
// Whether this process has a descriptor open on the file (dev, ino), asked of the kernel (fstat
// of each of its descriptors). True when /proc/self/fd cannot be read: a caller keeping a charge
// while the descriptor lives keeps it then.
bool DescriptorOpenOn(dev_t dev, ino_t ino);

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

  // Maps <dir>/memory.region read-write (read-only when `read_only`: tools and tests). Returns ""
  // or an error naming the file and the cause (missing, not a regular file, permissions, wrong
  // magic, another layout version, wrong size).
  std::string Open(const std::string& dir, bool read_only = false);
  // Loads the limits file `path` into this object's private memory (ReadLimitsFile). Until it is
  // loaded every limit is 0 (nothing is admitted) and the GPUs are the region's own slots.
  std::string LoadLimits(const std::string& path);
  bool is_open() const { return layout_ != nullptr; }
  bool has_limits() const { return has_limits_; }
  const std::string& path() const { return path_; }

  // The slot of GPU `uuid` ("GPU-…"), or -1: from the limits when loaded.
  int FindGpu(const char* uuid) const;
  uint32_t gpu_count() const;
  // The limit of `slot` from the private limits copy (0 without limits or for a bad slot).
  uint64_t limit(int slot) const;
  // The plugin asked for pass-through (the limits file's flag).
  bool passthrough() const { return has_limits_ && (limits_.flags & kLimitsPassthrough) != 0; }
  // The driver library the node named (version 2), or "" (then kDriverLibraryCandidates).
  const char* driver_path() const { return has_limits_ ? driver_.path : ""; }
  const GpuSlot& gpu(int slot) const { return layout_->gpus[slot]; }
  GpuSlot& gpu(int slot) { return layout_->gpus[slot]; }

  // Claims this process's slot (pid + start time), reaping dead owners first. Returns the slot
  // index, or -1 when every slot is held by a live process. Call again after fork().
  int Attach();
  // Whether another process holds slot `slot`'s lock (false also when it cannot be asked).
  bool SlotLockHeld(int slot) const;

  // Adds `bytes` to process slot `proc` and GPU `gpu` if the GPU's use stays within its limit.
  // With `force`, adds even past the limit (a size the driver chose after the fact). When the
  // first try fails, dead owners are reaped and it tries once more.
  bool Admit(int proc, int gpu, uint64_t bytes, bool force = false);
  // Returns `bytes` (at most what the process holds on the GPU).
  void Release(int proc, int gpu, uint64_t bytes);
  // Returns everything process slot `proc` holds on `gpu` (a context reset).
  void ReleaseAll(int proc, int gpu);
  // Frees the slots of dead owners and rebuilds every GPU's use. Returns the number reaped. A
  // slot whose lock is held is live; one whose lock is gone is dead unless /proc shows its owner
  // (pid and start time) alive: a process that closed its own lock descriptor stays charged.
  int Reap();
  // Frees the slots held under this process's own pid and start time: an earlier image of this
  // process (exec keeps both; its CUDA memory went with the image; its slot lock was O_CLOEXEC and
  // went too). A slot whose lock is held is live, whatever its numbers say (a process of a sibling
  // PID namespace can share pid and start time): it is never freed. Call once per process image,
  // before Attach. Returns the number freed.
  int ReleaseEarlierImages();

  std::vector<GpuUsage> Usage() const;

 private:
  bool Lock();  // false if the lock could not be taken
  void Unlock();
  void RebuildLocked();
  int ReapLocked();

  std::string path_;
  LimitsFile limits_{};
  LimitsDriver driver_{};
  bool has_limits_ = false;
  RegionLayout* layout_ = nullptr;
  size_t mapped_ = 0;
  bool read_only_ = false;
  int lock_fd_ = -1;    // the open file description holding this process's slot lock
  int locked_slot_ = -1;
};

// Tests only: where ProcessStartTime and OwnerAlive read <root>/PID/stat ("/proc" by default);
// a directory without those files stands for a /proc that cannot be read.
void SetProcRootForTesting(const char* root);

}  // namespace gpulet::cudashim
