// libgpulet-cuda.so: the memory-limit interposer. Loaded into a container's processes (by
// /etc/ld.so.preload or LD_PRELOAD), it stands in front of libcuda.so.1 and libnvidia-ml.so.1:
//
//   - programs linked against libcuda call our exported cu* symbols (they come first in the
//     lookup order); programs that dlopen the driver and dlsym a name get ours from our dlsym;
//     the CUDA runtime, which finds every entry point through cuGetProcAddress(_v2), gets ours
//     from our cuGetProcAddress, which asks the driver first (so versions and flags are the
//     driver's business) and swaps in the wrapper of exactly the variant the driver chose.
//     Symbols we do not wrap, cuGetExportTable's private tables included, pass through untouched.
//   - every producer of device memory is charged to the container's accounting region (region.h)
//     before the driver is called; over the limit the call returns CUDA_ERROR_OUT_OF_MEMORY and
//     the driver never sees it. Releases give the charge back.
//   - what programs read (cuMemGetInfo, cuDeviceTotalMem, nvmlDeviceGetMemoryInfo and _v2) is
//     the container's share: total = min(limit, physical), free = total - used clamped to
//     [0, total] and to what the GPU really has free.
//
// A C ABI library has no caller-owned object, so its state is one process-wide State, created on
// first use and never destroyed (other threads may still call in while the process exits).
//
// Where things are: driver_table.h resolves the driver's entry points (which driver, the hook
// table, REAL); accounting.h is the account and the record rules (tested alone in
// accounting_test.cc); region.h is the shared region and the limits file. This file holds the
// process state, then the wrappers grouped by what they charge: linear allocations, pools and
// async, arrays, contexts and modules, VMM, graphs, and what programs read.
#include <dlfcn.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cudashim/accounting.h"
#include "cudashim/cuda_api.h"
#include "cudashim/driver_table.h"
#include "cudashim/region.h"
#include "gpu/nvml_api.h"

namespace gpulet::cudashim {
namespace {

constexpr const char* kDefaultDir = "/run/gpulet/cuda";
constexpr int kMaxDevices = 64;
constexpr uint64_t kAllocAlign = 512;  // the driver's smallest allocation alignment

// ---- messages: one line each, once per cause ---------------------------------------------------

void Say(const char* fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "gpulet-cuda[%d]: %s\n", static_cast<int>(::getpid()), line);
}

// ---- accounting state --------------------------------------------------------------------------

enum class Mode { kActive, kPassthrough, kFailed };

// A pool destroyed with blocks still out: the driver releases it when the last is freed (Stream
// Ordered Memory Allocator, cuMemPoolDestroy), so what it held beyond those blocks stays charged
// until then.
struct DyingPool {
  int gpu = -1;
  uint64_t remainder = 0;
  size_t blocks = 0;
};

struct PoolState {
  int gpu = -1;
  uint64_t live = 0;     // bytes of allocations handed out and not freed
  uint64_t charged = 0;  // bytes charged to the region: what the pool holds (live + cached)
};

// Physical memory made by cuMemCreate (or imported): the driver keeps it while any handle to it
// or any mapping of it exists (Driver API, Virtual Memory Management: cuMemRelease, cuMemUnmap),
// so it stays charged that long.
struct Physical {
  int gpu = -1;
  uint64_t bytes = 0;  // charged
  int handle_refs = 0;
  int maps = 0;
  bool imported = false;  // not charged at creation: charged at its largest mapping
  ino_t exported_inode = 0;  // exported as a POSIX descriptor: alive while one is open
  dev_t exported_dev = 0;
};
struct HandleRef {
  uint64_t physical = 0;
  int refs = 0;
};
struct MapRecord {
  uint64_t size = 0;
  uint64_t physical = 0;
};

// Graph memory: an upper bound of what a graph's allocation nodes take, and the device.
struct GraphNeed {
  CUdevice dev = -1;
  uint64_t bytes = 0;
};

struct State {
  Mode mode = Mode::kFailed;
  std::string error;
  Region region;
  std::atomic<int> proc{-1};
  Account account{region, proc};
  std::mutex attach_mu;
  std::atomic<int> device_slot[kMaxDevices];  // -2: not looked up; -1: not in the region
  std::atomic<bool> warned_unlisted[kMaxDevices];

  std::mutex mu;  // guards everything below
  std::unordered_map<CUdeviceptr, Charge> pointers;
  std::unordered_map<CUmemGenericAllocationHandle, Charge> handles;
  std::unordered_map<const void*, Charge> arrays;   // CUarray and CUmipmappedArray
  std::unordered_map<const void*, Charge> modules;  // CUmodule and CUlibrary
  std::unordered_map<CUcontext, Charge> contexts;   // contexts we created (not primary)
  std::unordered_map<CUmemoryPool, PoolState> pools;
  int primary_refs[kMaxDevices] = {};
  uint64_t primary_charge[kMaxDevices] = {};
  uint64_t limit_charge[kMaxGpus] = {};  // by region slot: what cuCtxSetLimit reservations took
  std::atomic<bool> pools_cache{false};  // some pool holds freed blocks: reconcile at syncs
  std::unordered_map<uint64_t, DyingPool> dying_pools;
  uint64_t next_dying = 1;
  // VMM
  std::unordered_map<uint64_t, Physical> physical;
  std::unordered_map<CUmemGenericAllocationHandle, HandleRef> vmm_handles;
  std::map<CUdeviceptr, MapRecord> mappings;
  uint64_t next_physical = 1;
  // Some released, unmapped memory is kept only by an exported descriptor (SweepExportedLocked).
  std::atomic<bool> exported_pending{false};
  // graphs: what the graphs' allocator of each device is charged for (its reserved memory)
  std::unordered_map<const void*, GraphNeed> graph_need;  // CUgraph and CUgraphExec
  std::unordered_map<CUstream, GraphNeed> capture_need;
  uint64_t graph_charge[kMaxDevices] = {};
  std::atomic<int> captures{0};  // streams capturing now (wrapped begin/end)

  std::mutex primary_mu[kMaxDevices];  // the first retain of a primary context, one at a time
};

// Whether this image started with the driver's device files open: descriptors left open across
// exec (set at load, before the program or its driver could open any).
bool g_inherited_driver_descriptors = false;
__attribute__((constructor)) void NoteInheritedDriverDescriptors() {
  g_inherited_driver_descriptors = DescriptorsOpenUnder("/dev/nvidia");
}

State* NewState() {
  auto* s = new State();
  for (auto& d : s->device_slot) d.store(-2);
  for (auto& w : s->warned_unlisted) w.store(false);
  // The limits are the plugin's, read-only beside this library (region.h); nothing in the
  // environment names them or turns them off.
  s->error = s->region.LoadLimits(LimitsFileBesideLibrary());
  if (s->error.empty() && s->region.passthrough()) {
    s->mode = Mode::kPassthrough;
    Say("the node's limits file asks for pass-through: GPU memory limits are NOT enforced");
    return s;
  }
  const char* dir = std::getenv("GPULET_CUDA_DIR");
  if (dir == nullptr || *dir == '\0') dir = kDefaultDir;
  if (s->error.empty()) s->error = s->region.Open(dir);
  // exec keeps pid and start time: the image before this one held a slot, and its CUDA memory
  // went with it, unless its driver descriptors were made to survive exec (FD_CLOEXEC cleared):
  // then that memory is still the driver's, and its charge stays until this process exits.
  if (s->error.empty()) {
    if (g_inherited_driver_descriptors) {
      Say("driver descriptors (/dev/nvidia*) were inherited across exec: the earlier image's "
          "charges stay until this process exits");
    } else {
      s->region.ReleaseEarlierImages();
    }
  }
  if (s->error.empty()) s->proc.store(s->region.Attach());
  if (s->error.empty() && s->proc.load() < 0) {
    s->error = s->region.path() + ": all " + std::to_string(kMaxProcesses) +
               " process slots are held by live processes";
  }
  if (!s->error.empty()) {
    s->mode = Mode::kFailed;
    Say("cannot enforce GPU memory limits: %s; CUDA is refused in this process", s->error.c_str());
    return s;
  }
  s->mode = Mode::kActive;
  return s;
}

const char* NodeDriverPath(State& s) {
  if (s.region.has_limits() && s.region.driver_path()[0] != '\0') return s.region.driver_path();
  for (const char* candidate : kDriverLibraryCandidates) {
    if (::access(candidate, F_OK) == 0) return candidate;
  }
  return nullptr;
}

void AfterFork();

void BeforeFork();
void AfterForkParent();

State& S() {
  static State* state = [] {
    State* s = NewState();
    pthread_atfork(&BeforeFork, &AfterForkParent, &AfterFork);
    return s;
  }();
  return *state;
}

// fork() while another thread updates the maps: the prepare handler takes the lock, so the child
// copies them whole (and then clears them: CUDA state does not survive fork()).
void BeforeFork() {
  State& s = S();
  s.attach_mu.lock();
  s.mu.lock();
}
void AfterForkParent() {
  State& s = S();
  s.mu.unlock();
  s.attach_mu.unlock();
}

// A forked child is a new process: its own slot, none of the parent's allocations.
void AfterFork() {
  State& s = S();
  new (&s.mu) std::mutex();
  new (&s.attach_mu) std::mutex();
  for (auto& m : s.primary_mu) new (&m) std::mutex();
  s.proc.store(-1);
  s.physical.clear();
  s.vmm_handles.clear();
  s.mappings.clear();
  s.graph_need.clear();
  s.capture_need.clear();
  s.dying_pools.clear();
  std::fill(std::begin(s.graph_charge), std::end(s.graph_charge), 0);
  s.captures.store(0);
  s.pointers.clear();
  s.handles.clear();
  s.arrays.clear();
  s.modules.clear();
  s.contexts.clear();
  s.pools.clear();
  std::fill(std::begin(s.primary_refs), std::end(s.primary_refs), 0);
  std::fill(std::begin(s.primary_charge), std::end(s.primary_charge), 0);
  std::fill(std::begin(s.limit_charge), std::end(s.limit_charge), 0);
}

int Proc(State& s) {
  int p = s.proc.load(std::memory_order_acquire);
  if (p >= 0) return p;
  std::lock_guard lock(s.attach_mu);
  p = s.proc.load();
  if (p < 0) {
    p = s.region.Attach();
    if (p < 0) Say("%s: every process slot is held by a live process", s.region.path().c_str());
    s.proc.store(p, std::memory_order_release);
  }
  return p;
}

// The region slot of CUDA device `dev`: -1 when the region does not list it (then its memory is
// refused: a GPU the container sees without a limit is a configuration error, not a free pass).
int SlotOfDevice(State& s, CUdevice dev) {
  if (dev < 0 || dev >= kMaxDevices) return -1;
  int slot = s.device_slot[dev].load(std::memory_order_acquire);
  if (slot != -2) return slot;
  CUuuid u{};
  CUresult rc = CUDA_ERROR_NOT_FOUND;
  if (auto f = REAL(cuDeviceGetUuid_v2)) rc = f(&u, dev);
  if (rc != CUDA_SUCCESS) {
    if (auto f = REAL(cuDeviceGetUuid)) rc = f(&u, dev);
  }
  if (rc != CUDA_SUCCESS) return -1;  // not cached: the driver may answer later
  const std::string uuid = GpuUuidString(u);
  slot = s.region.FindGpu(uuid.c_str());
  if (slot < 0 && !s.warned_unlisted[dev].exchange(true)) {
    Say("%s: CUDA device %d (%s) has no memory limit in this region; its allocations are refused",
        s.region.path().c_str(), dev, uuid.c_str());
  }
  s.device_slot[dev].store(slot, std::memory_order_release);
  return slot;
}

// The current context's device, or the driver's own reason there is none
// (CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_NOT_INITIALIZED; CUDA_ERROR_NOT_FOUND for a driver
// without cuCtxGetDevice). Every allocating path charges this device or returns this error:
// nothing passes to the driver uncounted because its device could not be told.
CUresult CurrentDeviceOrError(CUdevice* dev) {
  auto f = REAL(cuCtxGetDevice);
  if (f == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = f(dev);
  return rc;
}

bool CurrentDevice(CUdevice* dev) { return CurrentDeviceOrError(dev) == CUDA_SUCCESS; }

uint64_t Aligned(uint64_t bytes) { return (bytes + kAllocAlign - 1) / kAllocAlign * kAllocAlign; }

// Pools and graph allocations take physical memory in 2 MiB granules.
constexpr uint64_t kGranule = 2ULL << 20;
uint64_t Granules(uint64_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }

// The outcome of charging before a driver call.
enum class Gate { kPass, kCharged, kRefused, kFailedClosed };

void SweepExported(State& s);

// Charges `bytes` on CUDA device `dev` to this process. kPass: not limited (pass-through mode).
Gate ChargeDevice(State& s, CUdevice dev, uint64_t bytes, int* slot_out) {
  if (s.mode == Mode::kPassthrough) return Gate::kPass;
  if (s.mode == Mode::kFailed) return Gate::kFailedClosed;
  const int slot = SlotOfDevice(s, dev);
  *slot_out = slot;
  if (slot < 0) return Gate::kRefused;
  const int proc = Proc(s);
  if (proc < 0) return Gate::kRefused;
  if (s.region.Admit(proc, slot, bytes)) return Gate::kCharged;
  SweepExported(s);  // memory kept only by a descriptor closed since: gone now
  return s.region.Admit(proc, slot, bytes) ? Gate::kCharged : Gate::kRefused;
}

CUresult Refusal(Gate g) {
  return g == Gate::kFailedClosed ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_OUT_OF_MEMORY;
}

void Uncharge(State& s, int slot, uint64_t bytes) { s.account.Uncharge(slot, bytes); }

// Uncharges and forgets physical allocation `id` once no handle, no mapping and no exported
// descriptor refers to it (Driver API, Virtual Memory Management, cuMemRelease: the memory is
// freed when every mapping is unmapped and every reference to the handle, its shareable
// counterparts included, is released).
void MaybeFreePhysicalLocked(State& s, uint64_t id) {
  auto it = s.physical.find(id);
  if (it == s.physical.end() || it->second.handle_refs > 0 || it->second.maps > 0) return;
  if (it->second.exported_inode != 0 &&
      DescriptorOpenOn(it->second.exported_dev, it->second.exported_inode)) {
    s.exported_pending.store(true, std::memory_order_relaxed);
    return;
  }
  Uncharge(s, it->second.gpu, it->second.bytes);
  s.physical.erase(it);
}

// Lets go of exported memory whose descriptor has been closed since its last handle and mapping
// went (called where the charge is read or needed: cuMemGetInfo, a refusal).
void SweepExported(State& s) {
  if (!s.exported_pending.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(s.mu);
  s.exported_pending.store(false, std::memory_order_relaxed);
  std::vector<uint64_t> ids;
  for (const auto& [id, p] : s.physical) {
    if (p.exported_inode != 0 && p.handle_refs == 0 && p.maps == 0) ids.push_back(id);
  }
  for (uint64_t id : ids) MaybeFreePhysicalLocked(s, id);
}

void Recharge(State& s, int slot, uint64_t from, uint64_t to) {
  s.account.Recharge(slot, from, to);
}

// Records (accounting.h), on this process's maps and account.
template <typename Map, typename Key>
bool TakeRecord(State& s, Map& m, const Key& key, typename Map::mapped_type* out) {
  return TakeRecord(s.mu, m, key, out);
}
template <typename Map, typename Key>
void PutBack(State& s, Map& m, const Key& key, const Charge& c) {
  PutBack(s.mu, s.account, m, key, c);
}
template <typename Map, typename Key>
void RecordLocked(State& s, Map& m, const Key& key, const Charge& c) {
  RecordLocked(s.account, m, key, c);
}

// ---- allocation families -----------------------------------------------------------------------

template <typename Call>
CUresult AllocateCounted(CUdeviceptr* dptr, uint64_t bytes, Call&& call) {
  State& s = S();
  CUdevice dev = 0;
  if (s.mode != Mode::kPassthrough) {
    if (const CUresult rc = CurrentDeviceOrError(&dev); rc != CUDA_SUCCESS) return rc;
  }
  int slot = -1;
  const Gate g = ChargeDevice(s, dev, bytes, &slot);
  if (g == Gate::kPass) return call();
  if (g != Gate::kCharged) return Refusal(g);
  const CUresult rc = call();
  if (rc != CUDA_SUCCESS || dptr == nullptr) {
    Uncharge(s, slot, bytes);
    return rc;
  }
  std::lock_guard lock(s.mu);
  RecordLocked(s, s.pointers, *dptr, Charge{slot, bytes, nullptr});
  return rc;
}

// Pool bookkeeping: returns what the pool really holds (RESERVED_MEM_CURRENT) to the charge.
void ReconcilePoolLocked(State& s, CUmemoryPool pool, PoolState& ps) {
  uint64_t reserved = 0;
  auto get = REAL(cuMemPoolGetAttribute);
  if (get == nullptr ||
      get(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS) {
    return;
  }
  const uint64_t target = std::max(ps.live, reserved);
  Recharge(s, ps.gpu, ps.charged, target);
  ps.charged = target;
}

void ReconcileAllPools(State& s) {
  if (!s.pools_cache.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(s.mu);
  bool cached = false;
  for (auto& [pool, ps] : s.pools) {
    if (ps.charged > ps.live) ReconcilePoolLocked(s, pool, ps);
    cached = cached || ps.charged > ps.live;
  }
  s.pools_cache.store(cached, std::memory_order_relaxed);
}

PoolState& PoolLocked(State& s, CUmemoryPool pool, int slot_hint) {
  auto [it, fresh] = s.pools.try_emplace(pool);
  if (fresh || it->second.gpu < 0) it->second.gpu = slot_hint;
  return it->second;
}

template <typename Call>
CUresult AllocateFromPool(CUdeviceptr* dptr, uint64_t bytes, CUmemoryPool pool, CUdevice dev,
                          Call&& call) {
  State& s = S();
  if (s.mode == Mode::kPassthrough) return call();
  if (s.mode == Mode::kFailed) return CUDA_ERROR_NOT_INITIALIZED;
  const int slot = SlotOfDevice(s, dev);
  const int proc = Proc(s);
  if (slot < 0 || proc < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t extra = 0;
  {
    // A pool serves a block from what it caches before it asks the device for more: only the
    // growth past what the pool already holds is new memory.
    std::lock_guard lock(s.mu);
    PoolState& ps = PoolLocked(s, pool, slot);
    const uint64_t need = ps.live + bytes;
    // A pool grows in steps of its own (2 MiB on current GPUs): charged rounded up to one before
    // the driver is asked, then set to what the pool really holds.
    extra = need > ps.charged ? Granules(need - ps.charged) : 0;
    if (extra != 0 && !s.region.Admit(proc, ps.gpu, extra)) return CUDA_ERROR_OUT_OF_MEMORY;
    ps.charged += extra;
    ps.live += bytes;
  }
  const CUresult rc = call();
  std::lock_guard lock(s.mu);
  PoolState& ps = PoolLocked(s, pool, slot);
  if (rc != CUDA_SUCCESS || dptr == nullptr) {
    ps.live -= bytes;
    ps.charged -= extra;
    Uncharge(s, ps.gpu, extra);
    return rc;
  }
  RecordLocked(s, s.pointers, *dptr, Charge{ps.gpu, bytes, pool});
  // The pool may have grown by more than the block (its own granularity): charge what it holds.
  ReconcilePoolLocked(s, pool, ps);
  if (ps.charged > ps.live) s.pools_cache.store(true, std::memory_order_relaxed);
  return rc;
}

// Settles the charge `c` of a pointer the driver freed. Pool blocks stay charged to their pool
// (it caches them) until a trim or a synchronization lets the pool release them.
void Freed(State& s, const Charge& c) {
  std::lock_guard lock(s.mu);
  if (c.pool == nullptr) {
    auto d = c.dying == 0 ? s.dying_pools.end() : s.dying_pools.find(c.dying);
    if (d == s.dying_pools.end()) {
      Uncharge(s, c.gpu, c.bytes);
      return;
    }
    // A block of a destroyed pool: its memory stays with the pool until the last block is freed.
    d->second.remainder += c.bytes;
    if (--d->second.blocks == 0) {
      Uncharge(s, d->second.gpu, d->second.remainder);
      s.dying_pools.erase(d);
    }
    return;
  }
  auto p = s.pools.find(c.pool);
  if (p == s.pools.end()) return;
  p->second.live -= std::min(p->second.live, c.bytes);
  ReconcilePoolLocked(s, c.pool, p->second);
  if (p->second.charged > p->second.live) s.pools_cache.store(true, std::memory_order_relaxed);
}

// Frees `dptr` through `free_call`, record first (see "records").
template <typename FreeCall>
CUresult FreePointer(CUdeviceptr dptr, FreeCall&& free_call) {
  State& s = S();
  Charge c;
  const bool had = TakeRecord(s, s.pointers, dptr, &c);
  const CUresult rc = free_call();
  if (!had) return rc;
  if (rc != CUDA_SUCCESS) {
    std::lock_guard lock(s.mu);
    if (!s.pointers.emplace(dptr, c).second && c.pool == nullptr) Uncharge(s, c.gpu, c.bytes);
    return rc;
  }
  Freed(s, c);
  return rc;
}

CUresult PoolOfDevice(CUdevice dev, CUmemoryPool* pool) {
  auto f = REAL(cuDeviceGetMemPool);
  if (f == nullptr) return CUDA_ERROR_NOT_FOUND;
  return f(pool, dev);
}

// ---- arrays ------------------------------------------------------------------------------------

uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

// Our own estimate of an array's size, from the format's storage (cuda_api.h): used only when the
// driver cannot say (see DriverArrayBytes). A format not in the table is charged at 16 bytes per
// element, the most any CUDA format stores per element: over, never under.
uint64_t ArrayBytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned channels) {
  ArrayFormatBlock b = ArrayFormatStorage(f);
  if (b.bytes == 0) b = ArrayFormatBlock{16, 1, 1, false};
  const uint64_t cols = (std::max<uint64_t>(w, 1) + b.width - 1) / b.width;
  const uint64_t rows = (std::max<uint64_t>(h, 1) + b.height - 1) / b.height;
  uint64_t n = SaturatingMul(cols, rows);
  n = SaturatingMul(n, std::max<uint64_t>(d, 1));
  n = SaturatingMul(n, SaturatingMul(b.per_channel ? std::max(channels, 1u) : 1, b.bytes));
  return n == UINT64_MAX ? n : Aligned(n);
}

uint64_t MipmapBytes(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels) {
  const bool keep_depth = (d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  uint64_t total = 0;
  for (unsigned l = 0; l < std::max(levels, 1u) && l < 64; ++l) {
    const size_t w = std::max<size_t>(d.Width >> l, 1);
    const size_t h = d.Height == 0 ? 0 : std::max<size_t>(d.Height >> l, 1);
    const size_t z = d.Depth == 0 ? 0 : keep_depth ? d.Depth : std::max<size_t>(d.Depth >> l, 1);
    const uint64_t b = ArrayBytes(w, h, z, d.Format, d.NumChannels);
    total = total > UINT64_MAX - b ? UINT64_MAX : total + b;
  }
  return total;
}

// The size the driver gives an array of descriptor `d` (`levels` 0: a plain array), asked of the
// driver before the array exists: cuArrayGetMemoryRequirements answers only for arrays made with
// CUDA_ARRAY3D_DEFERRED_MAPPING (Driver API, Memory Management), which take no memory, so the
// same array is made that way, asked, and destroyed. 0 when the driver cannot tell (before CUDA
// 11.6, or a descriptor deferred mapping does not take).
uint64_t DriverArrayBytes(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels, CUdevice dev) {
  CUDA_ARRAY3D_DESCRIPTOR probe = d;
  probe.Flags |= CUDA_ARRAY3D_DEFERRED_MAPPING;
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  CUresult rc = CUDA_ERROR_NOT_FOUND;
  if (levels == 0) {
    auto create = REAL(cuArray3DCreate_v2);
    auto get = REAL(cuArrayGetMemoryRequirements);
    auto destroy = REAL(cuArrayDestroy);
    CUarray a = nullptr;
    if (create == nullptr || get == nullptr || destroy == nullptr ||
        create(&a, &probe) != CUDA_SUCCESS) {
      return 0;
    }
    rc = get(&req, a, dev);
    destroy(a);
  } else {
    auto create = REAL(cuMipmappedArrayCreate);
    auto get = REAL(cuMipmappedArrayGetMemoryRequirements);
    auto destroy = REAL(cuMipmappedArrayDestroy);
    CUmipmappedArray a = nullptr;
    if (create == nullptr || get == nullptr || destroy == nullptr ||
        create(&a, &probe, levels) != CUDA_SUCCESS) {
      return 0;
    }
    rc = get(&req, a, dev);
    destroy(a);
  }
  return rc == CUDA_SUCCESS ? req.size : 0;
}

// Creates an array of descriptor `d` (`levels` 0: not mipmapped) through `create`, charged the
// driver's size before the driver makes it.
template <typename Create>
CUresult CreateArray(void** handle_out, const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels,
                     Create&& create) {
  State& s = S();
  if (s.mode == Mode::kPassthrough) return create();
  if (s.mode == Mode::kFailed) return CUDA_ERROR_NOT_INITIALIZED;
  // A deferred-mapping or sparse array has no memory of its own: what is mapped into it was made
  // (and charged) by cuMemCreate.
  if ((d.Flags & (CUDA_ARRAY3D_DEFERRED_MAPPING | CUDA_ARRAY3D_SPARSE)) != 0) return create();
  CUdevice dev = 0;
  if (const CUresult rc = CurrentDeviceOrError(&dev); rc != CUDA_SUCCESS) return rc;
  uint64_t bytes = DriverArrayBytes(d, levels, dev);
  if (bytes == 0) {
    bytes = levels == 0 ? ArrayBytes(d.Width, d.Height, d.Depth, d.Format, d.NumChannels)
                        : MipmapBytes(d, levels);
  }
  int slot = -1;
  const Gate g = ChargeDevice(s, dev, bytes, &slot);
  if (g == Gate::kPass) return create();
  if (g != Gate::kCharged) return Refusal(g);
  const CUresult rc = create();
  if (rc != CUDA_SUCCESS) {
    Uncharge(s, slot, bytes);
    return rc;
  }
  std::lock_guard lock(s.mu);
  RecordLocked(s, s.arrays, static_cast<const void*>(*handle_out), Charge{slot, bytes, nullptr});
  return rc;
}

template <typename Destroy>
CUresult DestroyArray(const void* handle, Destroy&& destroy) {
  State& s = S();
  Charge c;
  const bool had = TakeRecord(s, s.arrays, handle, &c);
  const CUresult rc = destroy();
  if (!had) return rc;
  if (rc != CUDA_SUCCESS) {
    PutBack(s, s.arrays, handle, c);
    return rc;
  }
  Uncharge(s, c.gpu, c.bytes);
  return rc;
}

// ---- contexts and modules ----------------------------------------------------------------------

// Free device memory as the current context sees it, or -1.
int64_t RealFree() {
  size_t free_b = 0, total_b = 0;
  auto f = REAL(cuMemGetInfo_v2);
  if (f == nullptr || f(&free_b, &total_b) != CUDA_SUCCESS) return -1;
  return static_cast<int64_t>(free_b);
}

// Measures what one context takes on `dev`, with `ctx` (already created) to stand on, from the
// free memory it sees before and after a throw-away context. The GPU is shared, so a neighbour
// allocating or freeing in that moment would skew it: a sample counts only when the free memory
// comes back to where it was once the probe is destroyed (nobody else moved it meanwhile), and two
// valid samples must agree. Returns the size, or 0 when no two valid samples agreed; then
// *fallback is the smallest positive sample (charged, not stored).
uint64_t MeasureContext(CUcontext ctx, CUdevice dev, uint64_t* fallback) {
  *fallback = 0;
  auto get = REAL(cuCtxGetCurrent);
  auto set = REAL(cuCtxSetCurrent);
  auto create = REAL(cuCtxCreate_v2);
  auto destroy = REAL(cuCtxDestroy_v2);
  if (get == nullptr || set == nullptr || create == nullptr || destroy == nullptr) return 0;
  CUcontext saved = nullptr;
  get(&saved);
  uint64_t agreed = 0, last_valid = 0;
  for (int attempt = 0; attempt < 4 && agreed == 0; ++attempt) {
    set(ctx);
    const int64_t before = RealFree();
    CUcontext probe = nullptr;
    int64_t after = -1, back = -1;
    if (create(&probe, 0, dev) == CUDA_SUCCESS) {
      after = RealFree();
      destroy(probe);
      set(ctx);
      back = RealFree();
    }
    if (before < 0 || after < 0 || before <= after) continue;
    const uint64_t sample = static_cast<uint64_t>(before - after);
    if (*fallback == 0 || sample < *fallback) *fallback = sample;
    if (back != before) continue;  // someone else moved the free memory: not a clean sample
    if (last_valid == sample) agreed = sample;
    last_valid = sample;
  }
  set(saved);
  return agreed;
}

// Charges a context on `dev`, created by `create` (which fills *ctx_out). If the GPU's context
// size is known it is charged before the driver is called; the first context of a GPU is created,
// measured, then charged (and destroyed again with `undo` when that does not fit). Only a
// validated measurement is kept in the region.
template <typename Create, typename Undo>
CUresult ChargeContext(CUdevice dev, CUcontext* ctx_out, uint64_t* charged, Create&& create,
                       Undo&& undo) {
  State& s = S();
  *charged = 0;
  if (s.mode == Mode::kPassthrough) return create();
  if (s.mode == Mode::kFailed) return CUDA_ERROR_NOT_INITIALIZED;
  const int slot = SlotOfDevice(s, dev);
  const int proc = Proc(s);
  if (slot < 0 || proc < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  GpuSlot& g = s.region.gpu(slot);
  uint64_t bytes = g.context_bytes.load();
  if (bytes != 0) {
    if (!s.region.Admit(proc, slot, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
    const CUresult rc = create();
    if (rc != CUDA_SUCCESS) {
      Uncharge(s, slot, bytes);
      return rc;
    }
    *charged = bytes;
    return rc;
  }
  const CUresult rc = create();
  if (rc != CUDA_SUCCESS) return rc;
  uint64_t fallback = 0;
  bytes = MeasureContext(*ctx_out, dev, &fallback);
  if (bytes != 0) {
    uint64_t expected = 0;
    if (!g.context_bytes.compare_exchange_strong(expected, bytes)) bytes = expected;
  } else {
    bytes = fallback;  // not stored: the next context measures again
  }
  if (bytes != 0 && !s.region.Admit(proc, slot, bytes)) {
    undo();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *charged = bytes;
  return rc;
}

// Every context of this process on `slot` is gone: the driver freed their memory, so the charges
// of their allocations go too (VMM handles from cuMemCreate live on until cuMemRelease).
void DropContextMemoryLocked(State& s, int slot) {
  uint64_t bytes = 0;
  if (slot >= 0 && static_cast<uint32_t>(slot) < kMaxGpus) {
    bytes += s.limit_charge[slot];  // the limits' reservations went with the contexts
    s.limit_charge[slot] = 0;
  }
  for (auto it = s.pointers.begin(); it != s.pointers.end();) {
    if (it->second.gpu != slot) {
      ++it;
      continue;
    }
    if (it->second.pool == nullptr) bytes += it->second.bytes;  // pool blocks: in the pool's charge
    it = s.pointers.erase(it);
  }
  for (auto* m : {&s.arrays, &s.modules}) {
    for (auto it = m->begin(); it != m->end();) {
      if (it->second.gpu == slot) {
        bytes += it->second.bytes;
        it = m->erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto it = s.pools.begin(); it != s.pools.end();) {
    if (it->second.gpu == slot) {
      bytes += it->second.charged;
      it = s.pools.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = s.dying_pools.begin(); it != s.dying_pools.end();) {
    if (it->second.gpu == slot) {
      bytes += it->second.remainder;
      it = s.dying_pools.erase(it);
    } else {
      ++it;
    }
  }
  Uncharge(s, slot, bytes);
}

bool NoContextLeftLocked(State& s, int slot) {
  for (int d = 0; d < kMaxDevices; ++d) {
    if (s.primary_refs[d] > 0 && s.device_slot[d].load() == slot) return false;
  }
  for (auto& [ctx, c] : s.contexts) {
    if (c.gpu == slot) return false;
  }
  return true;
}

template <typename Create>
CUresult CreateContext(CUcontext* pctx, CUdevice dev, Create&& create) {
  uint64_t charged = 0;
  auto destroy = REAL(cuCtxDestroy_v2);
  const CUresult rc = ChargeContext(dev, pctx, &charged, create, [&] {
    if (destroy != nullptr) destroy(*pctx);
  });
  if (rc != CUDA_SUCCESS || charged == 0) return rc;
  State& s = S();
  std::lock_guard lock(s.mu);
  RecordLocked(s, s.contexts, *pctx, Charge{SlotOfDevice(s, dev), charged, nullptr});
  return rc;
}

// Destroys a context (or green context) through `real`, record first (see "records").
template <typename Real>
CUresult DestroyContext(CUcontext ctx, Real&& real) {
  State& s = S();
  Charge c;
  const bool had = TakeRecord(s, s.contexts, ctx, &c);
  const CUresult rc = real(ctx);
  if (!had) return rc;
  if (rc != CUDA_SUCCESS) {
    PutBack(s, s.contexts, ctx, c);
    return rc;
  }
  std::lock_guard lock(s.mu);
  Uncharge(s, c.gpu, c.bytes);
  if (NoContextLeftLocked(s, c.gpu)) DropContextMemoryLocked(s, c.gpu);
  return rc;
}

void PrimaryGone(CUdevice dev, bool reset) {
  State& s = S();
  if (dev < 0 || dev >= kMaxDevices) return;
  std::lock_guard lock(s.mu);
  if (s.primary_refs[dev] == 0) return;
  if (!reset && --s.primary_refs[dev] > 0) return;
  s.primary_refs[dev] = 0;
  const int slot = s.device_slot[dev].load();
  Uncharge(s, slot, s.primary_charge[dev]);
  s.primary_charge[dev] = 0;
  if (slot >= 0 && NoContextLeftLocked(s, slot)) DropContextMemoryLocked(s, slot);
}

// What a module load took: the free memory the context sees before and after `load`.
template <typename Load>
CUresult MeasureLoad(Load&& load, uint64_t* bytes) {
  const int64_t before = RealFree();
  const CUresult rc = load();
  const int64_t after = RealFree();
  *bytes = rc == CUDA_SUCCESS && before >= 0 && after >= 0 && before > after
               ? static_cast<uint64_t>(before - after)
               : 0;
  return rc;
}

// Modules larger than this are measured twice: on a shared GPU a neighbour's allocation inside
// the load's window would otherwise be charged to this container.
constexpr uint64_t kModuleRecheckBytes = 256ULL << 20;

// Loads a module (or library) and charges what the load took: the free memory the context sees
// before and after. The size is known only afterwards; when it does not fit, the module is
// unloaded again and the load answers CUDA_ERROR_OUT_OF_MEMORY. A size past kModuleRecheckBytes
// is checked by unloading and loading again: the smaller of the two measurements is charged (a
// neighbour would have to allocate inside both windows to skew it).
template <typename Load, typename Unload>
CUresult LoadModule(void** handle_out, Load&& load, Unload&& unload) {
  State& s = S();
  if (s.mode == Mode::kPassthrough) return load();
  if (s.mode == Mode::kFailed) return CUDA_ERROR_NOT_INITIALIZED;
  // A context-independent load (cuLibraryLoad*) with no context current would be loaded into
  // every context later, where it cannot be measured: refused with the driver's own answer for
  // "no context", as module loads are.
  CUdevice dev = 0;
  if (const CUresult rc = CurrentDeviceOrError(&dev); rc != CUDA_SUCCESS) return rc;
  const int slot = SlotOfDevice(s, dev);
  const int proc = Proc(s);
  if (slot < 0 || proc < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  const GpuSlot& g = s.region.gpu(slot);
  if (g.used.load() >= s.region.limit(slot)) return CUDA_ERROR_OUT_OF_MEMORY;  // nothing fits
  uint64_t bytes = 0;
  CUresult rc = MeasureLoad(load, &bytes);
  if (rc != CUDA_SUCCESS) return rc;
  if (bytes > kModuleRecheckBytes) {
    unload();
    uint64_t again = 0;
    rc = MeasureLoad(load, &again);
    if (rc != CUDA_SUCCESS) return rc;
    bytes = std::min(bytes, again);
  }
  if (bytes != 0 && !s.region.Admit(proc, slot, bytes)) {
    unload();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::lock_guard lock(s.mu);
  RecordLocked(s, s.modules, static_cast<const void*>(*handle_out), Charge{slot, bytes, nullptr});
  return rc;
}

// Context limits (Driver API, Context Management, cuCtxSetLimit): the device malloc heap, the
// printf FIFO, the per-thread stack (for every thread that can be resident) and the device
// runtime's reservations are device memory the driver reserves when the limit is set. What a
// change took (or gave back) is the free memory the current context sees before and after it;
// a growth that does not fit is undone (the old value set back) and refused with
// CUDA_ERROR_OUT_OF_MEMORY. Unmeasurable (no free memory to read): set back and refused.
CUresult SetContextLimit(CUlimit limit, size_t value) {
  auto real = REAL(cuCtxSetLimit);
  auto get = REAL(cuCtxGetLimit);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  State& s = S();
  if (s.mode == Mode::kPassthrough) return real(limit, value);
  if (s.mode == Mode::kFailed) return CUDA_ERROR_NOT_INITIALIZED;
  CUdevice dev = 0;
  if (const CUresult rc = CurrentDeviceOrError(&dev); rc != CUDA_SUCCESS) return rc;
  const int slot = SlotOfDevice(s, dev);
  const int proc = Proc(s);
  if (slot < 0 || proc < 0 || static_cast<uint32_t>(slot) >= kMaxGpus) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  size_t old = 0;
  const bool can_undo = get != nullptr && get(&old, limit) == CUDA_SUCCESS;
  const int64_t before = RealFree();
  const CUresult rc = real(limit, value);
  if (rc != CUDA_SUCCESS) return rc;
  const int64_t after = RealFree();
  if (before < 0 || after < 0) {
    if (can_undo) real(limit, old);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (after < before) {
    const uint64_t grew = static_cast<uint64_t>(before - after);
    if (!s.region.Admit(proc, slot, grew)) {
      if (can_undo) real(limit, old);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    std::lock_guard lock(s.mu);
    s.limit_charge[slot] += grew;
  } else if (after > before) {
    std::lock_guard lock(s.mu);
    const uint64_t shrank = std::min(static_cast<uint64_t>(after - before), s.limit_charge[slot]);
    s.limit_charge[slot] -= shrank;
    Uncharge(s, slot, shrank);
  }
  return rc;
}

// Unloads a module or library through `unload`, record first (see "records").
template <typename Unload>
CUresult UnloadModule(const void* handle, Unload&& unload) {
  State& s = S();
  Charge c;
  const bool had = TakeRecord(s, s.modules, handle, &c);
  const CUresult rc = unload();
  if (!had) return rc;
  if (rc != CUDA_SUCCESS) {
    PutBack(s, s.modules, handle, c);
    return rc;
  }
  Uncharge(s, c.gpu, c.bytes);
  return rc;
}

// ---- what programs read ------------------------------------------------------------------------

// The container's view of a GPU: total = min(limit, physical); free = total - used, in signed
// arithmetic, clamped to [0, total] and to what the GPU itself has free.
void LimitedView(const Region& r, int slot, uint64_t physical_total, uint64_t physical_free,
                 uint64_t* total, uint64_t* free_out) {
  const GpuSlot& g = r.gpu(slot);
  const uint64_t t = std::min(r.limit(slot), physical_total);
  const int64_t used = static_cast<int64_t>(std::min<uint64_t>(g.used.load(), INT64_MAX));
  int64_t f = static_cast<int64_t>(std::min<uint64_t>(t, INT64_MAX)) - used;
  f = std::clamp<int64_t>(f, 0, static_cast<int64_t>(std::min<uint64_t>(t, INT64_MAX)));
  *total = t;
  *free_out = std::min<uint64_t>(static_cast<uint64_t>(f), physical_free);
}

// The region slot of an NVML device (by UUID), or -1.
int SlotOfNvmlDevice(State& s, nvmlDevice_t device) {
  if (s.mode != Mode::kActive) return -1;
  void* nvml = NvmlHandle();
  if (nvml == nullptr) return -1;
  auto get_uuid = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(
      RealDlsym()(nvml, "nvmlDeviceGetUUID"));
  char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
  if (get_uuid == nullptr || get_uuid(device, uuid, sizeof uuid) != NVML_SUCCESS) return -1;
  return s.region.FindGpu(uuid);
}

template <typename Fn>
Fn RealNvml(const char* name) {
  void* nvml = NvmlHandle();
  return nvml == nullptr ? nullptr : reinterpret_cast<Fn>(RealDlsym()(nvml, name));
}

// ---- cuGetProcAddress --------------------------------------------------------------------------

// The wrapper to hand out for `symbol` as the driver resolved it to `real` for this version and
// these flags, or -1 (not ours: pass the driver's pointer through).
int ChooseHook(const char* symbol, int cuda_version, cuuint64_t flags, void* real) {
  const NameIndex& names = Names();
  auto [first, last] = names.by_base.equal_range(symbol);
  if (first == last) {
    // Not a base name: an exact exported name ("cuMemAlloc_v2") some callers pass, or not ours.
    auto it = names.exact.find(symbol);
    return it == names.exact.end() ? -1 : it->second;
  }
  // The driver's answer decides: the wrapper of the variant whose exported function it handed
  // out. A function none of our variants is (a variant newer than this library) is passed through
  // untouched: calling another variant in its place would break its contract.
  for (auto it = first; it != last; ++it) {
    if (RealFor(it->second) == real) return it->second;
  }
  (void)cuda_version;
  (void)flags;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    Say("cuGetProcAddress(%s): the driver answered a variant this library does not know; passed "
        "through, its memory is not counted",
        symbol);
  }
  return -1;
}

CUresult ProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                     CUdriverProcAddressQueryResult* status, bool v2) {
  CUresult rc;
  if (v2) {
    auto real = REAL(cuGetProcAddress_v2);
    if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
    rc = real(symbol, pfn, cuda_version, flags, status);
  } else {
    auto real = REAL(cuGetProcAddress);
    if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
    rc = real(symbol, pfn, cuda_version, flags);
  }
  if (rc != CUDA_SUCCESS || symbol == nullptr || pfn == nullptr || *pfn == nullptr) return rc;
  if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
    *pfn = cuda_version >= 12000 ? reinterpret_cast<void*>(&::cuGetProcAddress_v2)
                                 : reinterpret_cast<void*>(&::cuGetProcAddress);
    return rc;
  }
  const int hook = ChooseHook(symbol, cuda_version, flags, *pfn);
  if (hook < 0) return rc;
  Hook& h = g_hooks[hook];
  void* expected = nullptr;
  h.real.compare_exchange_strong(expected, *pfn);  // call exactly what the driver chose
  *pfn = h.wrapper;
  return rc;
}

}  // namespace
}  // namespace gpulet::cudashim

using namespace gpulet::cudashim;  // NOLINT: the exported C entry points below

GPULET_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory);
GPULET_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory);

// ---- dlsym -------------------------------------------------------------------------------------

namespace {
// Finds libc's dlsym before main, so the hot path is a load and a jump.
__attribute__((constructor)) void SetRealDlsym() { RealDlsym(); }

// Our wrapper for `name` (a cu* or nvml* symbol some object has), or `real`. What the caller's
// lookup found is never recorded as the driver's function: RTLD_DEFAULT finds our own export, and
// a tenant library's no-op of the same name would otherwise stand in for the driver (RealFor
// asks the node's driver itself).
__attribute__((noinline)) void* WrapperFor(const char* name, void* real) noexcept {
  if (name[0] == 'c') {
    const NameIndex& names = Names();
    if (auto it = names.exact.find(name); it != names.exact.end()) {
      return g_hooks[it->second].wrapper;
    }
  } else if (std::strcmp(name, "nvmlDeviceGetMemoryInfo") == 0) {
    return reinterpret_cast<void*>(&::nvmlDeviceGetMemoryInfo);
  } else if (std::strcmp(name, "nvmlDeviceGetMemoryInfo_v2") == 0) {
    return reinterpret_cast<void*>(&::nvmlDeviceGetMemoryInfo_v2);
  }
  return real;
}
}  // namespace

// RTLD_NEXT is relative to the caller, which libc finds from its return address: that path must
// be a tail call (a jump) so libc sees our caller's address, not ours (tests/memlimit checks what
// a program's dlsym(RTLD_NEXT, …) finds). Other names than cu* and nvml* never leave this
// uninstrumented function: a sanitizer runtime asks dlsym for its interceptors before it is ready.
GPULET_EXPORT GPULET_NO_SANITIZE void* dlsym(void* __restrict handle,
                                             const char* __restrict name) noexcept {
  if (handle == RTLD_NEXT) return RealDlsym()(handle, name);
  void* real = RealDlsym()(handle, name);
  if (real == nullptr) return real;
  const bool cuda = name[0] == 'c' && name[1] == 'u';
  const bool nvml = name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l';
  return cuda || nvml ? WrapperFor(name, real) : real;
}

// ---- CUDA entry points -------------------------------------------------------------------------

GPULET_EXPORT CUresult cuInit(unsigned int flags) {
  State& s = S();
  if (s.mode == Mode::kFailed) return CUDA_ERROR_NOT_INITIALIZED;
  CALL_REAL(cuInit, flags);
}

GPULET_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                        cuuint64_t flags) {
  return ProcAddress(symbol, pfn, cudaVersion, flags, nullptr, false);
}

GPULET_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                           cuuint64_t flags,
                                           CUdriverProcAddressQueryResult* symbolStatus) {
  return ProcAddress(symbol, pfn, cudaVersion, flags, symbolStatus, true);
}

GPULET_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return AllocateCounted(dptr, Aligned(bytesize),
                         [&]() -> CUresult { CALL_REAL(cuMemAlloc_v2, dptr, bytesize); });
}

GPULET_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes,
                                          size_t Height, unsigned int ElementSizeBytes) {
  // Charged at a pitch of the width rounded to 512 bytes, then at the pitch the driver chose.
  const uint64_t estimate = SaturatingMul(Aligned(WidthInBytes), std::max<size_t>(Height, 1));
  const CUresult rc = AllocateCounted(dptr, estimate, [&]() -> CUresult {
    CALL_REAL(cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  });
  if (rc != CUDA_SUCCESS || pPitch == nullptr || dptr == nullptr) return rc;
  State& s = S();
  const uint64_t real = SaturatingMul(*pPitch, std::max<size_t>(Height, 1));
  std::lock_guard lock(s.mu);
  auto it = s.pointers.find(*dptr);
  if (it != s.pointers.end() && real != it->second.bytes) {
    Recharge(s, it->second.gpu, it->second.bytes, real);
    it->second.bytes = real;
  }
  return rc;
}

// Managed memory is charged in full to the current device: on a GPU it may all become resident
// there, and a limit that counted only what is resident now would be passed by a page fault.
GPULET_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  return AllocateCounted(dptr, Aligned(bytesize), [&]() -> CUresult {
    CALL_REAL(cuMemAllocManaged, dptr, bytesize, flags);
  });
}

GPULET_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  auto real = REAL(cuMemFree_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return FreePointer(dptr, [&] { return real(dptr); });
}

GPULET_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  auto real = REAL(cuMemGetInfo_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  SweepExported(S());
  size_t f = 0, t = 0;
  const CUresult rc = real(&f, &t);
  if (rc != CUDA_SUCCESS) return rc;
  State& s = S();
  CUdevice dev = 0;
  if (s.mode == Mode::kActive && CurrentDevice(&dev)) {
    const int slot = SlotOfDevice(s, dev);
    if (slot >= 0) {
      uint64_t lt = 0, lf = 0;
      LimitedView(s.region, slot, t, f, &lt, &lf);
      t = lt;
      f = lf;
    }
  }
  if (free != nullptr) *free = f;
  if (total != nullptr) *total = t;
  return rc;
}

GPULET_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  auto real = REAL(cuDeviceTotalMem_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(bytes, dev);
  if (rc != CUDA_SUCCESS || bytes == nullptr) return rc;
  State& s = S();
  if (s.mode == Mode::kActive) {
    const int slot = SlotOfDevice(s, dev);
    if (slot >= 0) *bytes = std::min<uint64_t>(*bytes, s.region.limit(slot));
  }
  return rc;
}

// ---- virtual memory: charged while any handle or mapping keeps the memory ----------------------

namespace {

// Adds one reference on handle value `handle` to physical allocation `id`. A stale entry under the
// same value (a release we never saw) gives its reference up first.
void RefHandleLocked(State& s, CUmemGenericAllocationHandle handle, uint64_t id) {
  auto [it, fresh] = s.vmm_handles.try_emplace(handle, HandleRef{id, 0});
  if (!fresh && it->second.physical != id) {
    const uint64_t old = it->second.physical;
    it->second = HandleRef{id, 0};
    if (auto p = s.physical.find(old); p != s.physical.end()) --p->second.handle_refs;
    MaybeFreePhysicalLocked(s, old);
  }
  if (it->second.refs++ == 0) ++s.physical[id].handle_refs;
}

uint64_t NewPhysicalLocked(State& s, const Physical& p) {
  const uint64_t id = s.next_physical++;
  s.physical[id] = p;
  return id;
}

ino_t InodeOf(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}
}  // namespace

GPULET_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                   const CUmemAllocationProp* prop, unsigned long long flags) {
  auto real = REAL(cuMemCreate);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  State& s = S();
  // Only memory on a device is counted; pinned host memory (HOST, HOST_NUMA) is not the GPU's.
  if (prop == nullptr || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return real(handle, size, prop, flags);
  }
  int slot = -1;
  const Gate g = ChargeDevice(s, prop->location.id, size, &slot);
  if (g == Gate::kPass) return real(handle, size, prop, flags);
  if (g != Gate::kCharged) return Refusal(g);
  const CUresult rc = real(handle, size, prop, flags);
  if (rc != CUDA_SUCCESS || handle == nullptr) {
    Uncharge(s, slot, size);
    return rc;
  }
  std::lock_guard lock(s.mu);
  const uint64_t id = NewPhysicalLocked(s, Physical{slot, size, 0, 0, false, 0});
  RefHandleLocked(s, *handle, id);
  return rc;
}

// The driver frees the memory only when every mapping is unmapped and every handle (imported
// ones included) released (Virtual Memory Management, cuMemRelease): the charge stays that long.
GPULET_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  auto real = REAL(cuMemRelease);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  State& s = S();
  HandleRef ref;
  bool had = false, last = false;
  {
    std::lock_guard lock(s.mu);
    auto it = s.vmm_handles.find(handle);
    if (it != s.vmm_handles.end()) {
      had = true;
      ref = it->second;
      last = --it->second.refs <= 0;
      if (last) s.vmm_handles.erase(it);  // the value may be handed out again at once
    }
  }
  const CUresult rc = real(handle);
  if (!had) return rc;
  std::lock_guard lock(s.mu);
  if (rc != CUDA_SUCCESS) {
    if (last) {
      if (!s.vmm_handles.emplace(handle, ref).second) {
        if (auto p = s.physical.find(ref.physical); p != s.physical.end()) --p->second.handle_refs;
        MaybeFreePhysicalLocked(s, ref.physical);
      }
    } else if (auto it = s.vmm_handles.find(handle); it != s.vmm_handles.end()) {
      ++it->second.refs;
    }
    return rc;
  }
  if (last) {
    if (auto p = s.physical.find(ref.physical); p != s.physical.end()) --p->second.handle_refs;
    MaybeFreePhysicalLocked(s, ref.physical);
  }
  return rc;
}

// A mapping keeps the memory alive after its handle is released. Imported memory (another
// process's, or ours through a descriptor we cannot match) is charged here, at the largest size
// mapped, before the driver maps it: the importer keeps it alive from now on.
GPULET_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                CUmemGenericAllocationHandle handle, unsigned long long flags) {
  auto real = REAL(cuMemMap);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  State& s = S();
  if (s.mode == Mode::kPassthrough) return real(ptr, size, offset, handle, flags);
  uint64_t id = 0, extra = 0;
  int slot = -1;
  {
    std::lock_guard lock(s.mu);
    auto h = s.vmm_handles.find(handle);
    if (h != s.vmm_handles.end()) {
      id = h->second.physical;
      Physical& p = s.physical[id];
      ++p.maps;  // pinned while the driver maps it
      if (p.imported && offset + size > p.bytes) extra = offset + size - p.bytes;
      slot = p.gpu;
    }
  }
  if (id == 0) return real(ptr, size, offset, handle, flags);  // not device memory we know
  if (extra != 0) {
    CUdevice dev = 0;
    if (slot < 0 && CurrentDevice(&dev)) slot = SlotOfDevice(s, dev);
    const int proc = Proc(s);
    if (slot < 0 || proc < 0 || !s.region.Admit(proc, slot, extra)) {
      std::lock_guard lock(s.mu);
      --s.physical[id].maps;
      MaybeFreePhysicalLocked(s, id);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  const CUresult rc = real(ptr, size, offset, handle, flags);
  std::lock_guard lock(s.mu);
  Physical& p = s.physical[id];
  if (rc != CUDA_SUCCESS) {
    Uncharge(s, slot, extra);
    --p.maps;
    MaybeFreePhysicalLocked(s, id);
    return rc;
  }
  if (extra != 0) {
    p.gpu = slot;
    p.bytes += extra;
  }
  auto [m, fresh] = s.mappings.try_emplace(ptr, MapRecord{size, id});
  if (!fresh) {  // a mapping we never saw go: let it go now
    const uint64_t old = m->second.physical;
    m->second = MapRecord{size, id};
    if (auto q = s.physical.find(old); q != s.physical.end()) --q->second.maps;
    MaybeFreePhysicalLocked(s, old);
  }
  return rc;
}

GPULET_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  auto real = REAL(cuMemUnmap);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  State& s = S();
  std::vector<std::pair<CUdeviceptr, MapRecord>> taken;
  {
    std::lock_guard lock(s.mu);
    for (auto it = s.mappings.lower_bound(ptr); it != s.mappings.end() && it->first < ptr + size;) {
      taken.emplace_back(*it);
      it = s.mappings.erase(it);
    }
  }
  const CUresult rc = real(ptr, size);
  std::lock_guard lock(s.mu);
  for (const auto& [start, m] : taken) {
    if (rc != CUDA_SUCCESS && s.mappings.emplace(start, m).second) continue;
    if (auto p = s.physical.find(m.physical); p != s.physical.end()) --p->second.maps;
    MaybeFreePhysicalLocked(s, m.physical);
  }
  return rc;
}

GPULET_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                   void* addr) {
  auto real = REAL(cuMemRetainAllocationHandle);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(handle, addr);
  if (rc != CUDA_SUCCESS || handle == nullptr) return rc;
  State& s = S();
  const auto a = reinterpret_cast<CUdeviceptr>(addr);
  std::lock_guard lock(s.mu);
  auto m = s.mappings.upper_bound(a);
  if (m == s.mappings.begin()) return rc;
  --m;
  if (a < m->first + m->second.size) RefHandleLocked(s, *handle, m->second.physical);
  return rc;
}

GPULET_EXPORT CUresult cuMemExportToShareableHandle(void* shareableHandle,
                                                    CUmemGenericAllocationHandle handle,
                                                    CUmemAllocationHandleType handleType,
                                                    unsigned long long flags) {
  auto real = REAL(cuMemExportToShareableHandle);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(shareableHandle, handle, handleType, flags);
  if (rc != CUDA_SUCCESS || shareableHandle == nullptr ||
      handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return rc;
  }
  int fd = -1;
  std::memcpy(&fd, shareableHandle, sizeof fd);
  State& s = S();
  const ino_t inode = InodeOf(fd);
  struct stat st {};
  if (inode == 0 || ::fstat(fd, &st) != 0) return rc;
  std::lock_guard lock(s.mu);
  auto h = s.vmm_handles.find(handle);
  if (h != s.vmm_handles.end()) {
    Physical& p = s.physical[h->second.physical];
    p.exported_inode = st.st_ino;
    p.exported_dev = st.st_dev;
  }
  return rc;
}

// An import is a new handle to memory that lives until it too is released. Our own export, seen
// again through its descriptor, is the same memory (already charged); any other is charged when
// mapped (cuMemMap).
GPULET_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                      void* osHandle,
                                                      CUmemAllocationHandleType shHandleType) {
  auto real = REAL(cuMemImportFromShareableHandle);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(handle, osHandle, shHandleType);
  if (rc != CUDA_SUCCESS || handle == nullptr) return rc;
  State& s = S();
  if (s.mode != Mode::kActive) return rc;
  const ino_t inode = shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                          ? InodeOf(static_cast<int>(reinterpret_cast<intptr_t>(osHandle)))
                          : 0;
  std::lock_guard lock(s.mu);
  uint64_t id = 0;
  for (const auto& [pid, p] : s.physical) {
    if (inode != 0 && p.exported_inode == inode) id = pid;
  }
  if (id == 0) id = NewPhysicalLocked(s, Physical{-1, 0, 0, 0, true, 0});
  RefHandleLocked(s, *handle, id);
  return rc;
}

namespace {
// The device of `stream`: its context's (Stream Ordered Memory Allocator: cuMemAllocAsync takes
// from the current pool of the stream's device), the current context's for the NULL streams.
CUresult StreamDevice(CUstream stream, CUdevice* dev) {
  const auto value = reinterpret_cast<uintptr_t>(stream);
  // NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
  if (value <= 2) return CurrentDeviceOrError(dev);
  auto get_ctx = REAL(cuStreamGetCtx);
  auto current = REAL(cuCtxGetCurrent);
  auto push = REAL(cuCtxPushCurrent_v2);
  auto pop = REAL(cuCtxPopCurrent_v2);
  CUcontext ctx = nullptr, now = nullptr;
  if (get_ctx == nullptr || current == nullptr || get_ctx(stream, &ctx) != CUDA_SUCCESS ||
      current(&now) != CUDA_SUCCESS) {
    return CurrentDeviceOrError(dev);
  }
  if (ctx == now || push == nullptr || pop == nullptr) return CurrentDeviceOrError(dev);
  if (const CUresult rc = push(ctx); rc != CUDA_SUCCESS) return rc;
  const CUresult rc = CurrentDeviceOrError(dev);
  CUcontext popped = nullptr;
  pop(&popped);
  return rc;
}

// True when `stream` is being captured into a graph: then cuMemAllocAsync makes a graph
// allocation node (the graph's memory, charged when the graph runs), not a pool block.
bool Capturing(State& s, CUstream stream) {
  if (s.captures.load(std::memory_order_relaxed) == 0) return false;
  auto is = REAL(cuStreamIsCapturing);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return is != nullptr && is(stream, &status) == CUDA_SUCCESS &&
         status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

// A capturing stream's allocation: a graph allocation node; its size joins the graph's need.
template <typename Call>
CUresult CaptureAlloc(State& s, CUstream stream, uint64_t bytes, CUdevice dev, Call&& call) {
  const CUresult rc = call();
  if (rc != CUDA_SUCCESS) return rc;
  std::lock_guard lock(s.mu);
  GraphNeed& need = s.capture_need[stream];
  need.dev = dev;
  need.bytes += bytes;
  return rc;
}

template <typename Real>
CUresult AllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream, Real real) {
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  State& s = S();
  if (s.mode == Mode::kFailed) return CUDA_ERROR_NOT_INITIALIZED;
  CUdevice dev = 0;
  CUmemoryPool pool = nullptr;
  if (s.mode == Mode::kPassthrough) return real(dptr, bytesize, stream);
  if (const CUresult rc = StreamDevice(stream, &dev); rc != CUDA_SUCCESS) return rc;
  if (Capturing(s, stream)) {
    return CaptureAlloc(s, stream, Granules(bytesize), dev,
                        [&] { return real(dptr, bytesize, stream); });
  }
  if (const CUresult rc = PoolOfDevice(dev, &pool); rc != CUDA_SUCCESS) return rc;
  return AllocateFromPool(dptr, Aligned(bytesize), pool, dev,
                          [&] { return real(dptr, bytesize, stream); });
}

template <typename Real>
CUresult AllocFromPool(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream,
                       Real real) {
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  State& s = S();
  CUdevice dev = 0;
  {
    // A pool made by cuMemPoolCreate or handed out by the device knows its GPU; otherwise the
    // current device is the best guess (imported pools hold the exporter's memory).
    std::lock_guard lock(s.mu);
    auto it = s.pools.find(pool);
    if (it != s.pools.end()) {
      for (int d = 0; d < kMaxDevices; ++d) {
        if (s.device_slot[d].load() == it->second.gpu) {
          dev = d;
          break;
        }
      }
    } else if (StreamDevice(stream, &dev) != CUDA_SUCCESS) {
      dev = 0;  // charged to device 0's slot; unlisted there, refused
    }
  }
  if (Capturing(s, stream)) {
    return CaptureAlloc(s, stream, Granules(bytesize), dev,
                        [&] { return real(dptr, bytesize, pool, stream); });
  }
  return AllocateFromPool(dptr, Aligned(bytesize), pool, dev,
                          [&] { return real(dptr, bytesize, pool, stream); });
}

template <typename Real>
CUresult FreeAsync(CUdeviceptr dptr, CUstream stream, Real real) {
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return FreePointer(dptr, [&] { return real(dptr, stream); });
}

void RecordPool(CUmemoryPool pool, CUdevice dev) {
  State& s = S();
  if (s.mode != Mode::kActive) return;
  const int slot = SlotOfDevice(s, dev);
  std::lock_guard lock(s.mu);
  PoolLocked(s, pool, slot);
}
}  // namespace

GPULET_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return AllocAsync(dptr, bytesize, hStream, REAL(cuMemAllocAsync));
}
GPULET_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return AllocAsync(dptr, bytesize, hStream, REAL(cuMemAllocAsync_ptsz));
}
GPULET_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                               CUmemoryPool pool, CUstream hStream) {
  return AllocFromPool(dptr, bytesize, pool, hStream, REAL(cuMemAllocFromPoolAsync));
}
GPULET_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                    CUmemoryPool pool, CUstream hStream) {
  return AllocFromPool(dptr, bytesize, pool, hStream, REAL(cuMemAllocFromPoolAsync_ptsz));
}
GPULET_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return FreeAsync(dptr, hStream, REAL(cuMemFreeAsync));
}
GPULET_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  return FreeAsync(dptr, hStream, REAL(cuMemFreeAsync_ptsz));
}

GPULET_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  auto real = REAL(cuMemPoolCreate);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(pool, poolProps);
  if (rc == CUDA_SUCCESS && pool != nullptr && poolProps != nullptr &&
      poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    RecordPool(*pool, poolProps->location.id);
  }
  return rc;
}

GPULET_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  auto real = REAL(cuMemPoolDestroy);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  State& s = S();
  // Record first (see "records"): the pool's handle may name a new pool as soon as this returns.
  PoolState ps;
  std::vector<std::pair<CUdeviceptr, Charge>> blocks;
  bool had = false;
  {
    std::lock_guard lock(s.mu);
    auto it = s.pools.find(pool);
    if (it != s.pools.end()) {
      had = true;
      ps = it->second;
      s.pools.erase(it);
      for (auto p = s.pointers.begin(); p != s.pointers.end();) {
        if (p->second.pool == pool) {
          blocks.emplace_back(*p);
          p = s.pointers.erase(p);
        } else {
          ++p;
        }
      }
    }
  }
  const CUresult rc = real(pool);
  if (!had) return rc;
  std::lock_guard lock(s.mu);
  if (rc != CUDA_SUCCESS) {
    s.pools.emplace(pool, ps);
    for (const auto& b : blocks) s.pointers.emplace(b);
    return rc;
  }
  if (blocks.empty()) {
    Uncharge(s, ps.gpu, ps.charged);
    return rc;
  }
  // Blocks are still out: each stays charged as it is, the rest of the pool until the last goes.
  const uint64_t id = s.next_dying++;
  uint64_t out = 0;
  for (auto& [ptr, c] : blocks) {
    out += c.bytes;
    RecordLocked(s, s.pointers, ptr, Charge{c.gpu, c.bytes, nullptr, id});
  }
  s.dying_pools[id] = DyingPool{ps.gpu, ps.charged > out ? ps.charged - out : 0, blocks.size()};
  return rc;
}

GPULET_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  auto real = REAL(cuMemPoolTrimTo);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(pool, minBytesToKeep);
  if (rc != CUDA_SUCCESS) return rc;
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.pools.find(pool);
  if (it != s.pools.end()) ReconcilePoolLocked(s, pool, it->second);
  return rc;
}

GPULET_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  auto real = REAL(cuDeviceGetDefaultMemPool);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(pool, dev);
  if (rc == CUDA_SUCCESS && pool != nullptr) RecordPool(*pool, dev);
  return rc;
}

GPULET_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  auto real = REAL(cuDeviceGetMemPool);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(pool, dev);
  if (rc == CUDA_SUCCESS && pool != nullptr) RecordPool(*pool, dev);
  return rc;
}

// Synchronization is where a pool gives memory above its release threshold back to the device.
GPULET_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  auto real = REAL(cuStreamSynchronize);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(hStream);
  if (rc == CUDA_SUCCESS) ReconcileAllPools(S());
  return rc;
}
GPULET_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  auto real = REAL(cuStreamSynchronize_ptsz);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(hStream);
  if (rc == CUDA_SUCCESS) ReconcileAllPools(S());
  return rc;
}
GPULET_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  auto real = REAL(cuEventSynchronize);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(hEvent);
  if (rc == CUDA_SUCCESS) ReconcileAllPools(S());
  return rc;
}
GPULET_EXPORT CUresult cuCtxSynchronize(void) {
  auto real = REAL(cuCtxSynchronize);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real();
  if (rc == CUDA_SUCCESS) ReconcileAllPools(S());
  return rc;
}
// CUDA 13's variant (a context argument), what the 13.x runtime asks cuGetProcAddress for: seen on
// a real H200 with driver 580, where it was passed through, uncounted, with a warning.
GPULET_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  auto real = REAL(cuCtxSynchronize_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(ctx);
  if (rc == CUDA_SUCCESS) ReconcileAllPools(S());
  return rc;
}

// ---- graphs: charged for what the graphs' allocator holds --------------------------------------
//
// Allocation nodes (cuGraphAddMemAllocNode, or cuMemAllocAsync on a capturing stream) take memory
// when the graph runs, from the device's graph allocator, which keeps it until
// cuDeviceGraphMemTrim (Graph Management; the programming guide's "Graph Memory Nodes"). Before a
// launch, what the graph's nodes may need past what that allocator holds unused is charged (or
// refused); afterwards the charge is set to what the driver reports it holds
// (cuDeviceGetGraphMemAttribute, RESERVED_MEM_CURRENT).

namespace {
bool GraphAttr(CUdevice dev, CUgraphMem_attribute attr, uint64_t* value) {
  auto get = REAL(cuDeviceGetGraphMemAttribute);
  *value = 0;
  return get != nullptr && get(dev, attr, value) == CUDA_SUCCESS;
}

void ReconcileGraphMemory(State& s, CUdevice dev) {
  if (s.mode != Mode::kActive || dev < 0 || dev >= kMaxDevices) return;
  const int slot = SlotOfDevice(s, dev);
  uint64_t reserved = 0;
  if (slot < 0 || !GraphAttr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved)) return;
  std::lock_guard lock(s.mu);
  Recharge(s, slot, s.graph_charge[dev], reserved);
  s.graph_charge[dev] = reserved;
}

template <typename Call>
CUresult RunGraph(CUgraphExec exec, CUstream stream, Call&& call) {
  State& s = S();
  if (s.mode == Mode::kPassthrough) return call();
  if (s.mode == Mode::kFailed) return CUDA_ERROR_NOT_INITIALIZED;
  GraphNeed need;
  {
    std::lock_guard lock(s.mu);
    if (auto it = s.graph_need.find(exec); it != s.graph_need.end()) need = it->second;
  }
  CUdevice dev = need.dev;
  if (dev < 0) {
    const CUresult rc = StreamDevice(stream, &dev);
    // No allocation node recorded: the launch itself takes no graph memory to charge.
    if (rc != CUDA_SUCCESS) return need.bytes == 0 ? call() : rc;
  }
  const int slot = SlotOfDevice(s, dev);
  uint64_t temp = 0;
  if (need.bytes != 0) {
    uint64_t reserved = 0, used = 0;
    GraphAttr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved);
    GraphAttr(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used);
    const uint64_t spare = reserved > used ? reserved - used : 0;
    temp = need.bytes > spare ? need.bytes - spare : 0;
    const int proc = Proc(s);
    if (temp != 0 && (slot < 0 || proc < 0 || !s.region.Admit(proc, slot, temp))) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  const CUresult rc = call();
  ReconcileGraphMemory(s, dev);
  Uncharge(s, slot, temp);
  return rc;
}

template <typename Real>
CUresult BeginCapture(CUstream stream, CUstreamCaptureMode mode, Real real) {
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(stream, mode);
  if (rc != CUDA_SUCCESS) return rc;
  State& s = S();
  std::lock_guard lock(s.mu);
  if (s.capture_need.emplace(stream, GraphNeed{}).second) s.captures.fetch_add(1);
  return rc;
}

template <typename Real>
CUresult EndCapture(CUstream stream, CUgraph* graph, Real real) {
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(stream, graph);
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.capture_need.find(stream);
  if (it == s.capture_need.end()) return rc;
  if (rc == CUDA_SUCCESS && graph != nullptr && *graph != nullptr) {
    GraphNeed& g = s.graph_need[*graph];
    g.dev = it->second.dev >= 0 ? it->second.dev : g.dev;
    g.bytes += it->second.bytes;
  }
  s.capture_need.erase(it);
  s.captures.fetch_sub(1);
  return rc;
}

void Instantiated(CUgraphExec* exec, CUgraph graph) {
  State& s = S();
  std::lock_guard lock(s.mu);
  auto it = s.graph_need.find(graph);
  if (exec != nullptr && it != s.graph_need.end()) s.graph_need[*exec] = it->second;
}

void GraphGone(const void* graph_or_exec) {
  State& s = S();
  std::lock_guard lock(s.mu);
  s.graph_need.erase(graph_or_exec);
}
}  // namespace

GPULET_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return BeginCapture(hStream, mode, REAL(cuStreamBeginCapture_v2));
}
GPULET_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return BeginCapture(hStream, mode, REAL(cuStreamBeginCapture_v2_ptsz));
}
GPULET_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return EndCapture(hStream, phGraph, REAL(cuStreamEndCapture));
}
GPULET_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return EndCapture(hStream, phGraph, REAL(cuStreamEndCapture_ptsz));
}

GPULET_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                              const CUgraphNode* dependencies,
                                              size_t numDependencies,
                                              CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  auto real = REAL(cuGraphAddMemAllocNode);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
  if (rc != CUDA_SUCCESS || nodeParams == nullptr) return rc;
  State& s = S();
  std::lock_guard lock(s.mu);
  GraphNeed& g = s.graph_need[hGraph];
  g.dev = nodeParams->poolProps.location.id;
  g.bytes += Granules(nodeParams->bytesize);
  return rc;
}

GPULET_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                   unsigned long long flags) {
  auto real = REAL(cuGraphInstantiateWithFlags);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(phGraphExec, hGraph, flags);
  if (rc == CUDA_SUCCESS) Instantiated(phGraphExec, hGraph);
  return rc;
}

GPULET_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                    CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  auto real = REAL(cuGraphInstantiateWithParams);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(phGraphExec, hGraph, params);
  if (rc == CUDA_SUCCESS) Instantiated(phGraphExec, hGraph);
  return rc;
}
GPULET_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                         CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  auto real = REAL(cuGraphInstantiateWithParams_ptsz);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(phGraphExec, hGraph, params);
  if (rc == CUDA_SUCCESS) Instantiated(phGraphExec, hGraph);
  return rc;
}

GPULET_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  auto real = REAL(cuGraphLaunch);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return RunGraph(hGraphExec, hStream, [&] { return real(hGraphExec, hStream); });
}
GPULET_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  auto real = REAL(cuGraphLaunch_ptsz);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return RunGraph(hGraphExec, hStream, [&] { return real(hGraphExec, hStream); });
}
GPULET_EXPORT CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
  auto real = REAL(cuGraphUpload);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return RunGraph(hGraphExec, hStream, [&] { return real(hGraphExec, hStream); });
}
// The per-thread default stream variants: the CUDA 13 runtime resolves them at start (seen on the
// H200 with driver 580: cuGraphUpload's was passed through uncounted before these existed).
GPULET_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  auto real = REAL(cuGraphUpload_ptsz);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return RunGraph(hGraphExec, hStream, [&] { return real(hGraphExec, hStream); });
}

GPULET_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  auto real = REAL(cuGraphExecDestroy);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(hGraphExec);
  if (rc == CUDA_SUCCESS) GraphGone(hGraphExec);
  return rc;
}

GPULET_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  auto real = REAL(cuGraphDestroy);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(hGraph);
  if (rc == CUDA_SUCCESS) GraphGone(hGraph);
  return rc;
}

GPULET_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device) {
  auto real = REAL(cuDeviceGraphMemTrim);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(device);
  if (rc == CUDA_SUCCESS) ReconcileGraphMemory(S(), device);
  return rc;
}

GPULET_EXPORT CUresult cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* d) {
  auto real = REAL(cuArrayCreate_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (pHandle == nullptr || d == nullptr) return real(pHandle, d);
  const CUDA_ARRAY3D_DESCRIPTOR d3{d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
  return CreateArray(reinterpret_cast<void**>(pHandle), d3, 0, [&] { return real(pHandle, d); });
}

GPULET_EXPORT CUresult cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  auto real = REAL(cuArray3DCreate_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (pHandle == nullptr || d == nullptr) return real(pHandle, d);
  return CreateArray(reinterpret_cast<void**>(pHandle), *d, 0, [&] { return real(pHandle, d); });
}

GPULET_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* pHandle,
                                              const CUDA_ARRAY3D_DESCRIPTOR* d,
                                              unsigned int numMipmapLevels) {
  auto real = REAL(cuMipmappedArrayCreate);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (pHandle == nullptr || d == nullptr || numMipmapLevels == 0)
    return real(pHandle, d, numMipmapLevels);
  return CreateArray(reinterpret_cast<void**>(pHandle), *d, numMipmapLevels,
                     [&] { return real(pHandle, d, numMipmapLevels); });
}

GPULET_EXPORT CUresult cuArrayDestroy(CUarray hArray) {
  auto real = REAL(cuArrayDestroy);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return DestroyArray(hArray, [&] { return real(hArray); });
}

GPULET_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
  auto real = REAL(cuMipmappedArrayDestroy);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return DestroyArray(hMipmappedArray, [&] { return real(hMipmappedArray); });
}

GPULET_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return CreateContext(pctx, dev,
                       [&]() -> CUresult { CALL_REAL(cuCtxCreate_v2, pctx, flags, dev); });
}
GPULET_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray,
                                      int numParams, unsigned int flags, CUdevice dev) {
  return CreateContext(pctx, dev, [&]() -> CUresult {
    CALL_REAL(cuCtxCreate_v3, pctx, paramsArray, numParams, flags, dev);
  });
}
GPULET_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params,
                                      unsigned int flags, CUdevice dev) {
  return CreateContext(pctx, dev,
                       [&]() -> CUresult { CALL_REAL(cuCtxCreate_v4, pctx, params, flags, dev); });
}
GPULET_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  auto real = REAL(cuCtxDestroy_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return DestroyContext(ctx, real);
}
GPULET_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  auto real = REAL(cuCtxDestroy);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return DestroyContext(ctx, real);
}

GPULET_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxRetain);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  State& s = S();
  if (s.mode == Mode::kPassthrough || dev < 0 || dev >= kMaxDevices) return real(pctx, dev);
  // Two threads retaining at once must not both charge the context the driver creates once.
  std::lock_guard first(s.primary_mu[dev]);
  {
    std::lock_guard lock(s.mu);
    if (s.primary_refs[dev] > 0) {  // the primary context exists: no new memory
      const CUresult rc = real(pctx, dev);
      if (rc == CUDA_SUCCESS) ++s.primary_refs[dev];
      return rc;
    }
  }
  uint64_t charged = 0;
  auto release = REAL(cuDevicePrimaryCtxRelease_v2);
  const CUresult rc = ChargeContext(
      dev, pctx, &charged, [&] { return real(pctx, dev); },
      [&] {
        if (release != nullptr) release(dev);
      });
  if (rc != CUDA_SUCCESS) return rc;
  std::lock_guard lock(s.mu);
  ++s.primary_refs[dev];
  s.primary_charge[dev] += charged;
  return rc;
}

GPULET_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxRelease_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(dev);
  if (rc == CUDA_SUCCESS) PrimaryGone(dev, false);
  return rc;
}
GPULET_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxRelease);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(dev);
  if (rc == CUDA_SUCCESS) PrimaryGone(dev, false);
  return rc;
}
GPULET_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxReset_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(dev);
  if (rc == CUDA_SUCCESS) PrimaryGone(dev, true);
  return rc;
}
GPULET_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  auto real = REAL(cuDevicePrimaryCtxReset);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = real(dev);
  if (rc == CUDA_SUCCESS) PrimaryGone(dev, true);
  return rc;
}

namespace {
// A module or library loaded through `load` (the driver's loader with the caller's arguments):
// measured and charged (LoadModule), unloaded again when it does not fit.
template <typename Load>
CUresult LoadCountedModule(CUmodule* module, Load&& load) {
  auto unload = REAL(cuModuleUnload);
  if (module == nullptr) return CUDA_ERROR_NOT_FOUND;
  return LoadModule(reinterpret_cast<void**>(module), load, [&] {
    if (unload != nullptr) unload(*module);
  });
}
template <typename Load>
CUresult LoadCountedLibrary(CUlibrary* library, Load&& load) {
  auto unload = REAL(cuLibraryUnload);
  if (library == nullptr) return CUDA_ERROR_NOT_FOUND;
  return LoadModule(reinterpret_cast<void**>(library), load, [&] {
    if (unload != nullptr) unload(*library);
  });
}
}  // namespace

GPULET_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  auto real = REAL(cuModuleLoadData);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return LoadCountedModule(module, [&] { return real(module, image); });
}

GPULET_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image,
                                          unsigned int numOptions, CUjit_option* options,
                                          void** optionValues) {
  auto real = REAL(cuModuleLoadDataEx);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return LoadCountedModule(
      module, [&] { return real(module, image, numOptions, options, optionValues); });
}

// The file and fat-binary loaders take the same device memory as the *Data ones (Module and
// Library Management): measured and charged the same way.
GPULET_EXPORT CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  auto real = REAL(cuModuleLoad);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return LoadCountedModule(module, [&] { return real(module, fname); });
}

GPULET_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  auto real = REAL(cuModuleLoadFatBinary);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return LoadCountedModule(module, [&] { return real(module, fatCubin); });
}

GPULET_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  auto real = REAL(cuModuleUnload);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return UnloadModule(hmod, [&] { return real(hmod); });
}

GPULET_EXPORT CUresult cuLibraryLoadData(CUlibrary* library, const void* code,
                                         CUjit_option* jitOptions, void** jitOptionsValues,
                                         unsigned int numJitOptions, void* libraryOptions,
                                         void** libraryOptionValues,
                                         unsigned int numLibraryOptions) {
  auto real = REAL(cuLibraryLoadData);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return LoadCountedLibrary(library, [&] {
    return real(library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                libraryOptionValues, numLibraryOptions);
  });
}

GPULET_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* fileName,
                                             CUjit_option* jitOptions, void** jitOptionsValues,
                                             unsigned int numJitOptions, void* libraryOptions,
                                             void** libraryOptionValues,
                                             unsigned int numLibraryOptions) {
  auto real = REAL(cuLibraryLoadFromFile);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return LoadCountedLibrary(library, [&] {
    return real(library, fileName, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                libraryOptionValues, numLibraryOptions);
  });
}

GPULET_EXPORT CUresult cuLibraryUnload(CUlibrary library) {
  auto real = REAL(cuLibraryUnload);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return UnloadModule(library, [&] { return real(library); });
}

GPULET_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  return SetContextLimit(limit, value);
}

// Green contexts (Driver API, Green Contexts: cuGreenCtxCreate, CUDA 12.4) are contexts of their
// own, not made current: charged the GPU's measured context size before the driver makes one,
// given back at cuGreenCtxDestroy. Before any context of the GPU has been measured (or the plugin
// set the size) there is nothing to charge it by: refused, never passed uncounted.
GPULET_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev,
                                        unsigned int flags) {
  auto real = REAL(cuGreenCtxCreate);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  State& s = S();
  if (s.mode == Mode::kPassthrough) return real(phCtx, desc, dev, flags);
  if (s.mode == Mode::kFailed) return CUDA_ERROR_NOT_INITIALIZED;
  if (phCtx == nullptr) return real(phCtx, desc, dev, flags);  // the driver's INVALID_VALUE
  const int slot = SlotOfDevice(s, dev);
  const int proc = Proc(s);
  if (slot < 0 || proc < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  const uint64_t bytes = s.region.gpu(slot).context_bytes.load();
  if (bytes == 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      Say("cuGreenCtxCreate before any context of device %d was measured: refused (create the "
          "primary context first)",
          dev);
    }
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (!s.region.Admit(proc, slot, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult rc = real(phCtx, desc, dev, flags);
  if (rc != CUDA_SUCCESS) {
    Uncharge(s, slot, bytes);
    return rc;
  }
  std::lock_guard lock(s.mu);
  RecordLocked(s, s.contexts, reinterpret_cast<CUcontext>(*phCtx), Charge{slot, bytes, nullptr});
  return rc;
}

GPULET_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx hCtx) {
  auto real = REAL(cuGreenCtxDestroy);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  return DestroyContext(reinterpret_cast<CUcontext>(hCtx), [&](CUcontext) { return real(hCtx); });
}

// The pre-3.2 32-bit entry points: refused, never passed through uncounted.
#define GPULET_LEGACY_DEFINE(name, base, since)                                                   \
  GPULET_EXPORT CUresult name(...) {                                                              \
    Say(#name " is the 32-bit API from before CUDA 3.2; refused (its memory cannot be counted)"); \
    return CUDA_ERROR_NOT_SUPPORTED;                                                              \
  }
GPULET_CUDA_LEGACY(GPULET_LEGACY_DEFINE)
#undef GPULET_LEGACY_DEFINE

// ---- NVML --------------------------------------------------------------------------------------

GPULET_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  auto real = RealNvml<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*)>("nvmlDeviceGetMemoryInfo");
  if (real == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
  const nvmlReturn_t rc = real(device, memory);
  if (rc != NVML_SUCCESS || memory == nullptr) return rc;
  State& s = S();
  const int slot = SlotOfNvmlDevice(s, device);
  if (slot < 0) return rc;
  uint64_t t = 0, f = 0;
  LimitedView(s.region, slot, memory->total, memory->free, &t, &f);
  memory->total = t;
  memory->free = f;
  memory->used = t - f;
  return rc;
}

// The v2 answer also names memory the driver reserves; inside a limit there is none to report:
// total, free and used are the same as cuMemGetInfo's and v1's, reserved is 0.
GPULET_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device,
                                                      nvmlMemory_v2_t* memory) {
  auto real =
      RealNvml<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t*)>("nvmlDeviceGetMemoryInfo_v2");
  if (real == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
  const nvmlReturn_t rc = real(device, memory);
  if (rc != NVML_SUCCESS || memory == nullptr) return rc;
  State& s = S();
  const int slot = SlotOfNvmlDevice(s, device);
  if (slot < 0) return rc;
  uint64_t t = 0, f = 0;
  LimitedView(s.region, slot, memory->total, memory->free + memory->reserved, &t, &f);
  memory->total = t;
  memory->reserved = 0;
  memory->free = f;
  memory->used = t - f;
  return rc;
}
