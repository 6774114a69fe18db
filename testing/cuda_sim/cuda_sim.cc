// The simulated CUDA driver (libcuda.so.1): the entry points of src/cudashim/cuda_api.h with the
// driver's semantics for what the memory-limit library cares about, answering from the same
// fixture as the simulated NVML (GPULET_SIM_FIXTURE: each GPU's UUID and memory size).
//
// Each process is its own node here: device memory use is per process (a real GPU's is shared),
// which is what lets a test measure exactly what the library charged. Knobs (environment):
//   GPULET_CUDA_SIM_CONTEXT_BYTES  device memory a context takes (default 300 MiB)
//   GPULET_CUDA_SIM_MODULE_BYTES   device memory a loaded module or library takes (default 2 MiB)
//
// Exported functions never call each other through the dynamic linker (linked -Bsymbolic): the
// library in front of us must see each program call exactly once.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cudashim/cuda_api.h"
#include "sim/fixture.h"

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

struct CUctx_st {
  int dev = 0;
  bool primary = false;
};
struct CUmod_st {
  CUctx_st* ctx = nullptr;
};
struct CUlib_st {
  CUctx_st* ctx = nullptr;
};
struct CUarray_st {
  int dev = 0;
  uint64_t bytes = 0;
};
struct CUmipmappedArray_st {
  int dev = 0;
  uint64_t bytes = 0;
};
struct CUmemPoolHandle_st {
  int dev = 0;
  uint64_t reserved = 0;  // taken from the device
  uint64_t used = 0;      // handed out
  uint64_t threshold = 0;
};

namespace gpulet::cudasim {
namespace {

constexpr uint64_t kMiB = 1024ULL * 1024ULL;

struct Device {
  std::string uuid;
  CUuuid uuid_bytes{};
  uint64_t total = 0;
  uint64_t used = 0;
  std::unique_ptr<CUctx_st> primary;
  int primary_refs = 0;
  std::unique_ptr<CUmemPoolHandle_st> default_pool;
  CUmemPoolHandle_st* current_pool = nullptr;
};

struct Allocation {
  int dev = 0;
  uint64_t bytes = 0;
  CUctx_st* ctx = nullptr;
  CUmemPoolHandle_st* pool = nullptr;
};

uint64_t EnvBytes(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::strtoull(v, nullptr, 10);
}

CUuuid ParseUuid(const std::string& s) {
  CUuuid u{};
  int n = 0;
  for (size_t i = 4; i + 1 < s.size() && n < 16; ++i) {
    if (s[i] == '-') continue;
    u.bytes[n++] = static_cast<char>(std::stoi(s.substr(i, 2), nullptr, 16));
    ++i;
  }
  return u;
}

struct Driver {
  std::mutex mu;
  bool initialized = false;
  int cuda_version = 12040;
  uint64_t context_bytes = 300 * kMiB;
  uint64_t module_bytes = 2 * kMiB;
  std::vector<Device> devices;
  std::unordered_map<CUdeviceptr, Allocation> pointers;
  std::unordered_map<CUmemGenericAllocationHandle, Allocation> handles;
  std::map<CUctx_st*, std::unique_ptr<CUctx_st>> contexts;  // created, not primary
  std::map<void*, Allocation> objects;                      // arrays, modules, libraries
  std::map<CUmemPoolHandle_st*, std::unique_ptr<CUmemPoolHandle_st>> pools;
  CUdeviceptr next_ptr = 0x7f0000000000ULL;
  CUmemGenericAllocationHandle next_handle = 1;

  bool loaded = false;

  // Reads the fixture (once); cuInit and cuDriverGetVersion both need it.
  CUresult Load() {
    if (loaded) return CUDA_SUCCESS;
    const char* path = std::getenv("GPULET_SIM_FIXTURE");
    if (path == nullptr) return CUDA_ERROR_NO_DEVICE;
    auto fixture = gpulet::sim::LoadFixture(path);
    if (!fixture.ok()) return CUDA_ERROR_NO_DEVICE;
    cuda_version = fixture->cuda_version;
    context_bytes = EnvBytes("GPULET_CUDA_SIM_CONTEXT_BYTES", context_bytes);
    module_bytes = EnvBytes("GPULET_CUDA_SIM_MODULE_BYTES", module_bytes);
    for (const auto& g : fixture->gpus) {
      Device d;
      d.uuid = g.uuid;
      d.uuid_bytes = ParseUuid(g.uuid);
      d.total = g.memory_mib * kMiB;
      d.primary = std::make_unique<CUctx_st>(CUctx_st{static_cast<int>(devices.size()), true});
      d.default_pool = std::make_unique<CUmemPoolHandle_st>();
      d.default_pool->dev = static_cast<int>(devices.size());
      d.current_pool = d.default_pool.get();
      devices.push_back(std::move(d));
    }
    loaded = true;
    return CUDA_SUCCESS;
  }

  CUresult Init() {
    const CUresult rc = Load();
    if (rc == CUDA_SUCCESS) initialized = true;
    return rc;
  }

  bool ValidDevice(CUdevice dev) const {
    return initialized && dev >= 0 && static_cast<size_t>(dev) < devices.size();
  }

  // Takes `bytes` of device `dev`, or CUDA_ERROR_OUT_OF_MEMORY.
  CUresult Take(int dev, uint64_t bytes) {
    Device& d = devices[dev];
    if (bytes > d.total - d.used) return CUDA_ERROR_OUT_OF_MEMORY;
    d.used += bytes;
    return CUDA_SUCCESS;
  }
  void Give(int dev, uint64_t bytes) { devices[dev].used -= std::min(devices[dev].used, bytes); }

  CUdeviceptr NextPointer(uint64_t bytes) {
    const CUdeviceptr p = next_ptr;
    next_ptr += (bytes + 0xFFFF) / 0x10000 * 0x10000 + 0x10000;
    return p;
  }

  bool Known(CUctx_st* ctx) {
    if (ctx == nullptr) return false;
    if (ctx->primary) return devices[ctx->dev].primary_refs > 0;
    return contexts.count(ctx) != 0;
  }

  // Frees everything that lived in `ctx` (its destruction or reset).
  void DropContext(CUctx_st* ctx) {
    for (auto it = pointers.begin(); it != pointers.end();) {
      if (it->second.ctx == ctx && it->second.pool == nullptr) {
        Give(it->second.dev, it->second.bytes);
        it = pointers.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = objects.begin(); it != objects.end();) {
      if (it->second.ctx == ctx) {
        Give(it->second.dev, it->second.bytes);
        it = objects.erase(it);
      } else {
        ++it;
      }
    }
    Give(ctx->dev, context_bytes);
  }

  // Gives a pool's unused memory above `keep` back to the device.
  void Trim(CUmemPoolHandle_st* pool, uint64_t keep) {
    const uint64_t target = std::max(pool->used, keep);
    if (pool->reserved > target) {
      Give(pool->dev, pool->reserved - target);
      pool->reserved = target;
    }
  }

  CUresult AllocFromPool(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUctx_st* ctx) {
    if (dptr == nullptr || bytes == 0 || pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const uint64_t cached = pool->reserved - pool->used;
    if (bytes > cached) {
      if (CUresult rc = Take(pool->dev, bytes - cached); rc != CUDA_SUCCESS) return rc;
      pool->reserved += bytes - cached;
    }
    pool->used += bytes;
    *dptr = NextPointer(bytes);
    pointers[*dptr] = Allocation{pool->dev, bytes, ctx, pool};
    return CUDA_SUCCESS;
  }

  CUresult Free(CUdeviceptr dptr) {
    auto it = pointers.find(dptr);
    if (it == pointers.end()) return CUDA_ERROR_INVALID_VALUE;
    if (it->second.pool != nullptr) {
      it->second.pool->used -= it->second.bytes;  // cached by the pool until a trim or a sync
    } else {
      Give(it->second.dev, it->second.bytes);
    }
    pointers.erase(it);
    return CUDA_SUCCESS;
  }

  void Synchronize() {
    for (auto& d : devices) Trim(d.default_pool.get(), d.default_pool->threshold);
    for (auto& [p, pool] : pools) Trim(pool.get(), pool->threshold);
  }
};

Driver& D() {
  static Driver* driver = new Driver();  // never destroyed: calls may come during exit
  return *driver;
}

thread_local std::vector<CUctx_st*> tl_stack;

CUctx_st* Current() { return tl_stack.empty() ? nullptr : tl_stack.back(); }

// Every entry point but cuInit, cuDriverGetVersion and cuGetProcAddress needs cuInit first.
#define SIM_LOCK()            \
  Driver& d = D();            \
  std::lock_guard lock(d.mu); \
  if (!d.initialized) return CUDA_ERROR_NOT_INITIALIZED

#define SIM_CONTEXT()        \
  CUctx_st* ctx = Current(); \
  if (ctx == nullptr || !d.Known(ctx)) return CUDA_ERROR_INVALID_CONTEXT

using gpulet::cudashim::ArrayFormatBytes;

// The simulated layout: elements packed, the whole rounded up to 64 KiB pages.
uint64_t ArrayFootprint(size_t w, size_t h, size_t z, CUarray_format f, unsigned channels) {
  const uint64_t raw = std::max<uint64_t>(w, 1) * std::max<uint64_t>(h, 1) *
                       std::max<uint64_t>(z, 1) * channels * ArrayFormatBytes(f);
  return (raw + 0xFFFF) / 0x10000 * 0x10000;
}

const char kExportTableMagic[16] = "gpulet-sim-etbl";

}  // namespace
}  // namespace gpulet::cudasim

using gpulet::cudashim::ArrayFormatBytes;
using gpulet::cudasim::Current;
using gpulet::cudasim::D;
using gpulet::cudasim::Driver;
using gpulet::cudasim::tl_stack;

SIM_EXPORT CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard lock(d.mu);
  return d.Init();
}

SIM_EXPORT CUresult cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard lock(d.mu);
  const CUresult rc = d.Load();  // answered before cuInit, as the real driver does
  if (rc != CUDA_SUCCESS) return rc;
  *driverVersion = d.cuda_version;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  SIM_LOCK();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!d.ValidDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetCount(int* count) {
  SIM_LOCK();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = static_cast<int>(d.devices.size());
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  SIM_LOCK();
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!d.ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *uuid = d.devices[dev].uuid_bytes;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  SIM_LOCK();
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!d.ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *uuid = d.devices[dev].uuid_bytes;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  SIM_LOCK();
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!d.ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = d.devices[dev].total;
  return CUDA_SUCCESS;
}

// ---- contexts ----------------------------------------------------------------------------------

namespace {
CUresult CreateContext(CUcontext* pctx, CUdevice dev) {
  SIM_LOCK();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!d.ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (CUresult rc = d.Take(dev, d.context_bytes); rc != CUDA_SUCCESS) return rc;
  auto ctx = std::make_unique<CUctx_st>(CUctx_st{dev, false});
  *pctx = ctx.get();
  tl_stack.push_back(ctx.get());
  d.contexts.emplace(ctx.get(), std::move(ctx));
  return CUDA_SUCCESS;
}

CUresult DestroyContext(CUcontext ctx) {
  SIM_LOCK();
  auto it = d.contexts.find(ctx);
  if (it == d.contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  d.DropContext(ctx);
  std::erase(tl_stack, ctx);
  d.contexts.erase(it);
  return CUDA_SUCCESS;
}

CUresult ReleasePrimary(CUdevice dev, bool reset) {
  SIM_LOCK();
  if (!d.ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  auto& dv = d.devices[dev];
  if (dv.primary_refs == 0) return reset ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  if (!reset && --dv.primary_refs > 0) return CUDA_SUCCESS;
  dv.primary_refs = 0;
  d.DropContext(dv.primary.get());
  d.Trim(dv.default_pool.get(), 0);
  std::erase(tl_stack, dv.primary.get());
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int, CUdevice dev) {
  return CreateContext(pctx, dev);
}
SIM_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam*, int, unsigned int,
                                   CUdevice dev) {
  return CreateContext(pctx, dev);
}
SIM_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams*, unsigned int,
                                   CUdevice dev) {
  return CreateContext(pctx, dev);
}
SIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { return DestroyContext(ctx); }
SIM_EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return DestroyContext(ctx); }

SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  SIM_LOCK();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!d.ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  auto& dv = d.devices[dev];
  if (dv.primary_refs == 0) {
    if (CUresult rc = d.Take(dev, d.context_bytes); rc != CUDA_SUCCESS) return rc;
  }
  ++dv.primary_refs;
  *pctx = dv.primary.get();
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return ReleasePrimary(dev, false);
}
SIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return ReleasePrimary(dev, false); }
SIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { return ReleasePrimary(dev, true); }
SIM_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return ReleasePrimary(dev, true); }

SIM_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  SIM_LOCK();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  SIM_CONTEXT();
  *device = ctx->dev;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  SIM_LOCK();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = gpulet::cudasim::Current();
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  SIM_LOCK();
  if (ctx != nullptr && !d.Known(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (!tl_stack.empty()) tl_stack.pop_back();
  if (ctx != nullptr) tl_stack.push_back(ctx);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSynchronize(void) {
  SIM_LOCK();
  SIM_CONTEXT();
  d.Synchronize();
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamSynchronize(CUstream) {
  SIM_LOCK();
  SIM_CONTEXT();
  d.Synchronize();
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream) {
  SIM_LOCK();
  SIM_CONTEXT();
  d.Synchronize();
  return CUDA_SUCCESS;
}

// ---- linear memory -----------------------------------------------------------------------------

SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = d.Take(ctx->dev, bytesize); rc != CUDA_SUCCESS) return rc;
  *dptr = d.NextPointer(bytesize);
  d.pointers[*dptr] = gpulet::cudasim::Allocation{ctx->dev, bytesize, ctx, nullptr};
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes,
                                       size_t Height, unsigned int ElementSizeBytes) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0 ||
      (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t pitch = (WidthInBytes + 511) / 512 * 512;
  if (CUresult rc = d.Take(ctx->dev, pitch * Height); rc != CUDA_SUCCESS) return rc;
  *pPitch = pitch;
  *dptr = d.NextPointer(pitch * Height);
  d.pointers[*dptr] = gpulet::cudasim::Allocation{ctx->dev, pitch * Height, ctx, nullptr};
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (dptr == nullptr || bytesize == 0 || flags == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = d.Take(ctx->dev, bytesize); rc != CUDA_SUCCESS) return rc;
  *dptr = d.NextPointer(bytesize);
  d.pointers[*dptr] = gpulet::cudasim::Allocation{ctx->dev, bytesize, ctx, nullptr};
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  SIM_LOCK();
  return d.Free(dptr);
}

SIM_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto& dv = d.devices[ctx->dev];
  *total = dv.total;
  *free = dv.total - dv.used;
  return CUDA_SUCCESS;
}

// ---- virtual memory management -----------------------------------------------------------------

SIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                const CUmemAllocationProp* prop, unsigned long long flags) {
  SIM_LOCK();
  if (handle == nullptr || prop == nullptr || flags != 0 || size == 0 ||
      size % (2 * gpulet::cudasim::kMiB) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int dev = -1;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    if (!d.ValidDevice(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
    dev = prop->location.id;
    if (CUresult rc = d.Take(dev, size); rc != CUDA_SUCCESS) return rc;
  } else if (prop->location.type == CU_MEM_LOCATION_TYPE_INVALID) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *handle = d.next_handle++;
  d.handles[*handle] = gpulet::cudasim::Allocation{dev, dev < 0 ? 0 : size, nullptr, nullptr};
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  SIM_LOCK();
  auto it = d.handles.find(handle);
  if (it == d.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  if (it->second.dev >= 0) d.Give(it->second.dev, it->second.bytes);
  d.handles.erase(it);
  return CUDA_SUCCESS;
}

// ---- stream-ordered allocator ------------------------------------------------------------------

namespace {
CUresult AllocAsync(CUdeviceptr* dptr, size_t bytesize) {
  SIM_LOCK();
  SIM_CONTEXT();
  return d.AllocFromPool(dptr, bytesize, d.devices[ctx->dev].current_pool, ctx);
}
CUresult AllocFromPool(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool) {
  SIM_LOCK();
  SIM_CONTEXT();
  return d.AllocFromPool(dptr, bytesize, pool, ctx);
}
CUresult FreeAsync(CUdeviceptr dptr) {
  SIM_LOCK();
  return d.Free(dptr);
}
}  // namespace

SIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream) {
  return AllocAsync(dptr, bytesize);
}
SIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream) {
  return AllocAsync(dptr, bytesize);
}
SIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                            CUstream) {
  return AllocFromPool(dptr, bytesize, pool);
}
SIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                 CUmemoryPool pool, CUstream) {
  return AllocFromPool(dptr, bytesize, pool);
}
SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream) { return FreeAsync(dptr); }
SIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream) { return FreeAsync(dptr); }

SIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  SIM_LOCK();
  if (pool == nullptr || props == nullptr || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!d.ValidDevice(props->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  auto p = std::make_unique<CUmemPoolHandle_st>();
  p->dev = props->location.id;
  *pool = p.get();
  d.pools.emplace(p.get(), std::move(p));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  SIM_LOCK();
  auto it = d.pools.find(pool);
  if (it == d.pools.end()) return CUDA_ERROR_INVALID_VALUE;
  for (auto p = d.pointers.begin(); p != d.pointers.end();) {
    p = p->second.pool == pool ? d.pointers.erase(p) : std::next(p);
  }
  d.Give(pool->dev, pool->reserved);
  d.pools.erase(it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  SIM_LOCK();
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  d.Trim(pool, minBytesToKeep);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                          void* value) {
  SIM_LOCK();
  if (pool == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t v = 0;
  switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      v = pool->threshold;
      break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      v = pool->reserved;
      break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      v = pool->used;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  std::memcpy(value, &v, sizeof v);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  SIM_LOCK();
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!d.ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *pool = d.devices[dev].default_pool.get();
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  SIM_LOCK();
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!d.ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *pool = d.devices[dev].current_pool;
  return CUDA_SUCCESS;
}

// ---- arrays ------------------------------------------------------------------------------------

namespace {
template <typename Handle>
CUresult CreateObject(Handle* out, uint64_t bytes) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = d.Take(ctx->dev, bytes); rc != CUDA_SUCCESS) return rc;
  auto* h = new std::remove_pointer_t<Handle>{ctx->dev, bytes};
  *out = h;
  d.objects[h] = gpulet::cudasim::Allocation{ctx->dev, bytes, ctx, nullptr};
  return CUDA_SUCCESS;
}

template <typename Handle>
CUresult DestroyObject(Handle h) {
  SIM_LOCK();
  auto it = d.objects.find(h);
  if (it == d.objects.end()) return CUDA_ERROR_INVALID_HANDLE;
  d.Give(it->second.dev, it->second.bytes);
  d.objects.erase(it);
  delete h;
  return CUDA_SUCCESS;
}

template <typename Handle>
CUresult Requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* r, Handle h, CUdevice dev) {
  SIM_LOCK();
  if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = d.objects.find(h);
  if (it == d.objects.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (dev != it->second.dev) return CUDA_ERROR_INVALID_DEVICE;
  *r = CUDA_ARRAY_MEMORY_REQUIREMENTS{};
  r->size = it->second.bytes;
  r->alignment = 0x10000;
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* a) {
  if (a == nullptr || ArrayFormatBytes(a->Format) == 0 || a->Width == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CreateObject(
      pHandle, gpulet::cudasim::ArrayFootprint(a->Width, a->Height, 0, a->Format, a->NumChannels));
}

SIM_EXPORT CUresult cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* a) {
  if (a == nullptr || ArrayFormatBytes(a->Format) == 0 || a->Width == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CreateObject(pHandle, gpulet::cudasim::ArrayFootprint(a->Width, a->Height, a->Depth,
                                                               a->Format, a->NumChannels));
}

SIM_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* pHandle,
                                           const CUDA_ARRAY3D_DESCRIPTOR* a, unsigned int levels) {
  if (a == nullptr || ArrayFormatBytes(a->Format) == 0 || a->Width == 0 || levels == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  uint64_t bytes = 0;
  for (unsigned l = 0; l < levels && l < 64; ++l) {
    bytes += gpulet::cudasim::ArrayFootprint(
        std::max<size_t>(a->Width >> l, 1),
        a->Height == 0 ? 0 : std::max<size_t>(a->Height >> l, 1),
        a->Depth == 0 ? 0 : std::max<size_t>(a->Depth >> l, 1), a->Format, a->NumChannels);
  }
  return CreateObject(pHandle, bytes);
}

SIM_EXPORT CUresult cuArrayDestroy(CUarray h) { return DestroyObject(h); }
SIM_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) { return DestroyObject(h); }
SIM_EXPORT CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* r, CUarray a,
                                                 CUdevice dev) {
  return Requirements(r, a, dev);
}
SIM_EXPORT CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* r,
                                                          CUmipmappedArray a, CUdevice dev) {
  return Requirements(r, a, dev);
}

// ---- modules -----------------------------------------------------------------------------------

namespace {
template <typename Handle>
CUresult LoadObject(Handle* out, const void* image) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (out == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = d.Take(ctx->dev, d.module_bytes); rc != CUDA_SUCCESS) return rc;
  auto* h = new std::remove_pointer_t<Handle>{ctx};
  *out = h;
  d.objects[h] = gpulet::cudasim::Allocation{ctx->dev, d.module_bytes, ctx, nullptr};
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return LoadObject(module, image);
}
SIM_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int,
                                       CUjit_option*, void**) {
  return LoadObject(module, image);
}
SIM_EXPORT CUresult cuModuleUnload(CUmodule h) { return DestroyObject(h); }
SIM_EXPORT CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option*, void**,
                                      unsigned int, void*, void**, unsigned int) {
  return LoadObject(library, code);
}
SIM_EXPORT CUresult cuLibraryUnload(CUlibrary h) { return DestroyObject(h); }

SIM_EXPORT CUresult cuLaunchKernel(void* f, unsigned int, unsigned int, unsigned int, unsigned int,
                                   unsigned int, unsigned int, unsigned int, CUstream, void**,
                                   void**) {
  return f == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

// Private tables of the runtime: opaque here, handed out for any id so a caller can check that
// the pointer it got is the driver's own.
SIM_EXPORT CUresult cuGetExportTable(const void** ppExportTable, const CUuuid* id) {
  if (ppExportTable == nullptr || id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ppExportTable = gpulet::cudasim::kExportTableMagic;
  return CUDA_SUCCESS;
}

// ---- cuGetProcAddress --------------------------------------------------------------------------

namespace {
struct Entry {
  std::string_view name, base;
  int since;
  bool ptsz;
  void* fn;
};

#define GPULET_SIM_ENTRY(name, base, since, ptsz, ret, params) \
  {#name, #base, since, ptsz != 0, reinterpret_cast<void*>(&::name)},
const Entry kEntries[] = {GPULET_CUDA_WRAPPED(GPULET_SIM_ENTRY)
                              GPULET_CUDA_PLAIN(GPULET_SIM_ENTRY)};
#undef GPULET_SIM_ENTRY

// The driver's rule: the newest variant of `symbol` that `cuda_version` knows; the _ptsz/_ptds
// variant when the caller asks for per-thread default stream semantics. An exact exported name
// that is no base name ("cuMemAlloc_v2") is accepted too.
CUresult ProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                     CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const Entry* best = nullptr;
  bool known = false;
  for (const Entry& e : kEntries) {
    if (e.base != symbol) continue;
    known = true;
    if (e.since > cuda_version) continue;
    if (e.ptsz && !per_thread) continue;
    if (best == nullptr || (e.ptsz && !best->ptsz) ||
        (e.ptsz == best->ptsz && e.since > best->since)) {
      best = &e;
    }
  }
  if (!known) {
    for (const Entry& e : kEntries) {
      if (e.name == symbol) best = &e;
    }
    known = best != nullptr;
  }
  *pfn = best == nullptr ? nullptr : best->fn;
  if (status != nullptr) {
    *status = best != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS
              : known         ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                              : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  return best == nullptr ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                     cuuint64_t flags) {
  return ProcAddress(symbol, pfn, cudaVersion, flags, nullptr);
}

SIM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                        cuuint64_t flags,
                                        CUdriverProcAddressQueryResult* symbolStatus) {
  return ProcAddress(symbol, pfn, cudaVersion, flags, symbolStatus);
}
