// The simulated CUDA driver (libcuda.so.1): a model of the driver's memory semantics, written from
// the CUDA Driver API reference (not from the memory-limit library in src/cudashim, whose
// assumptions it exists to test), answering from the same fixture as the simulated NVML
// (GPULET_SIM_FIXTURE: each GPU's UUID and memory size).
//
// Each rule that decides how long device memory lives cites the section of the Driver API
// reference it follows ("[VMM]" = Virtual Memory Management, "[SOMA]" = Stream Ordered Memory
// Allocator, "[GRAPH]" = Graph Management and the programming guide's "Graph Memory Nodes",
// "[MEM]" = Memory Management, "[CTX]" = Context/Primary Context Management, "[MOD]" = Module
// and Library Management, "[GPA]" = Driver Entry Point Access). Where the reference leaves a
// choice open (granularities, layouts) the model makes one and says so.
//
// Each process is its own node here: device memory use is per process (a real GPU's is shared,
// modelled by gpulet_sim_neighbour), which is what lets a test compare exactly what the library
// charged with what the driver holds. Knobs (environment):
//   GPULET_CUDA_SIM_CONTEXT_BYTES  device memory a context takes (default 300 MiB)
//   GPULET_CUDA_SIM_MODULE_BYTES   device memory a loaded module or library takes (default 2 MiB)
//   GPULET_SIM_DEVICE_NODES        a directory (a container's /dev): only the GPUs whose device node
//                                  <dir>/nvidia<index> exists are enumerated, in fixture order, as
//                                  the real driver sees only the GPUs a container was given (unset:
//                                  every GPU of the fixture)
// Test hooks (exported, not part of the driver API): gpulet_sim_device_used,
// gpulet_sim_neighbour, gpulet_sim_set_hook (see the end of this file).
//
// Exported functions never call each other through the dynamic linker (linked -Bsymbolic): the
// library in front of us must see each program call exactly once.
#include <dirent.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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
  size_t limits[5] = {1024, 1 << 20, 8 << 20, 2, 2048};  // cuCtxSetLimit's, the model's defaults
  uint64_t limit_bytes = 0;  // device memory the limits above their defaults reserve
};
struct CUmod_st {
  CUctx_st* ctx = nullptr;
};
struct CUlib_st {
  CUctx_st* ctx = nullptr;
};
struct CUarray_st {
  int dev = 0;
};
struct CUmipmappedArray_st {
  int dev = 0;
};
struct CUmemPoolHandle_st {
  int dev = 0;
  uint64_t reserved = 0;  // taken from the device
  uint64_t used = 0;      // handed out
  uint64_t threshold = 0;
  bool destroyed = false;  // destroyed with allocations outstanding
};
struct CUstream_st {
  CUctx_st* ctx = nullptr;
  CUgraph_st* capture = nullptr;  // the graph being captured into, or none
};
struct CUevent_st {
  int unused = 0;
};
struct CUgraphNode_st {
  bool alloc = false;  // an allocation node; else a free node
  CUdeviceptr dptr = 0;
};
struct CUgraph_st {
  std::vector<std::unique_ptr<CUgraphNode_st>> nodes;
  int execs = 0;
};
struct CUgraphExec_st {
  CUgraph_st* graph = nullptr;
};

namespace gpulet::cudasim {
namespace {

constexpr uint64_t kMiB = 1024ULL * 1024ULL;
// The model's choices where the reference names none: linear allocations are rounded to 512
// bytes, pools grow in 2 MiB steps, VMM and graph memory in 2 MiB granules.
constexpr uint64_t kLinearAlign = 512;
constexpr uint64_t kPoolGrowth = 2 * kMiB;
constexpr uint64_t kGranule = 2 * kMiB;

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct Device {
  std::string uuid;
  CUuuid uuid_bytes{};
  uint64_t total = 0;
  uint64_t used = 0;   // held by this process
  uint64_t other = 0;  // held by other tenants of the GPU (gpulet_sim_neighbour)
  std::unique_ptr<CUctx_st> primary;
  int primary_refs = 0;
  std::unique_ptr<CUmemPoolHandle_st> default_pool;
  CUmemPoolHandle_st* current_pool = nullptr;
  uint64_t graph_reserved = 0;  // the graphs' allocator: memory it holds
  uint64_t graph_used = 0;      // of which live graph allocations
};

struct Allocation {
  int dev = 0;
  uint64_t bytes = 0;
  CUctx_st* ctx = nullptr;
  CUmemPoolHandle_st* pool = nullptr;
};

// Physical memory made by cuMemCreate: alive while any handle to it or any mapping of it is.
struct Physical {
  int dev = -1;  // -1: host memory
  uint64_t bytes = 0;
  int handles = 0;  // handle values that refer to it
  int maps = 0;
  CUmemGenericAllocationHandle first_handle = 0;
  ino_t exported_inode = 0;
  dev_t exported_dev = 0;
};

// Whether a descriptor of this process still names the file (dev, ino): an exported shareable
// handle not yet closed. (Descriptors sent to other processes are out of the model's sight: each
// process is its own node here.)
bool DescriptorOpen(dev_t dev, ino_t ino) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return true;  // cannot tell: the memory stays
  const int own = ::dirfd(dir);
  bool open = false;
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) == 0 && st.st_ino == ino && st.st_dev == dev) {
      open = true;
      break;
    }
  }
  ::closedir(dir);
  return open;
}
struct HandleRef {
  uint64_t physical = 0;
  int refs = 0;
};
struct Mapping {
  uint64_t size = 0;
  uint64_t physical = 0;
  CUmemGenericAllocationHandle handle = 0;
};

struct GraphAllocation {
  int dev = 0;
  uint64_t bytes = 0;
  CUgraph_st* graph = nullptr;  // nullptr once the graph is destroyed
  bool live = false;
  bool freed_in_graph = false;
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

// Device virtual addresses. [MEM] says nothing about when a freed address comes back; the model
// takes the strictest reading: at once. A request is served from the most recently freed range
// that fits, so the address another thread just freed is the one handed out next.
class AddressSpace {
 public:
  CUdeviceptr Take(uint64_t bytes) {
    const uint64_t need = RoundUp(std::max<uint64_t>(bytes, 1), 0x10000);
    for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
      if (it->second < need) continue;
      const CUdeviceptr p = it->first;
      if (it->second == need) {
        free_.erase(std::next(it).base());
      } else {
        it->first += need;
        it->second -= need;
      }
      return p;
    }
    const CUdeviceptr p = next_;
    next_ += need;
    return p;
  }
  void Give(CUdeviceptr p, uint64_t bytes) {
    free_.emplace_back(p, RoundUp(std::max<uint64_t>(bytes, 1), 0x10000));
    if (free_.size() > 4096) free_.erase(free_.begin());  // forgotten: address space is vast
  }

 private:
  std::vector<std::pair<CUdeviceptr, uint64_t>> free_;
  CUdeviceptr next_ = 0x7f0000000000ULL;
};

using Hook = void (*)(const char* event, unsigned long long value);
Hook g_hook = nullptr;

struct Driver {
  std::mutex mu;
  bool initialized = false;
  bool loaded = false;
  int cuda_version = 12040;
  uint64_t context_bytes = 300 * kMiB;
  uint64_t module_bytes = 2 * kMiB;
  std::vector<Device> devices;
  AddressSpace addresses;
  std::unordered_map<CUdeviceptr, Allocation> pointers;
  std::map<CUctx_st*, std::unique_ptr<CUctx_st>> contexts;  // created, not primary
  std::map<void*, Allocation> objects;                      // arrays, modules, libraries
  std::multimap<void*, Allocation> library_loads;  // a library's loads into further contexts
  std::map<void*, uint64_t> deferred;  // deferred-mapping arrays: their size, nothing taken
  std::map<CUmemPoolHandle_st*, std::unique_ptr<CUmemPoolHandle_st>> pools;
  std::map<CUmemPoolHandle_st*, std::unique_ptr<CUmemPoolHandle_st>> dying_pools;
  std::map<CUstream_st*, std::unique_ptr<CUstream_st>> streams;
  std::map<CUevent_st*, std::unique_ptr<CUevent_st>> events;
  // VMM
  std::unordered_map<uint64_t, Physical> physical;
  std::unordered_map<CUmemGenericAllocationHandle, HandleRef> handles;
  std::vector<CUmemGenericAllocationHandle> free_handles;
  CUmemGenericAllocationHandle next_handle = 1;
  uint64_t next_physical = 1;
  std::map<CUdeviceptr, uint64_t> reservations;  // start → size
  std::map<CUdeviceptr, Mapping> mappings;       // start → mapping
  CUdeviceptr next_reservation = 0x200000000000ULL;
  // graphs
  std::map<CUgraph_st*, std::unique_ptr<CUgraph_st>> graphs;
  std::map<CUgraphExec_st*, std::unique_ptr<CUgraphExec_st>> execs;
  std::unordered_map<CUdeviceptr, GraphAllocation> graph_allocations;

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
    const char* nodes = std::getenv("GPULET_SIM_DEVICE_NODES");
    for (const auto& g : fixture->gpus) {
      struct stat st {};
      if (nodes != nullptr && *nodes != '\0' &&
          ::stat((std::string(nodes) + "/nvidia" + std::to_string(g.index)).c_str(), &st) != 0) {
        continue;
      }
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

  bool ValidDevice(CUdevice dev) const {
    return initialized && dev >= 0 && static_cast<size_t>(dev) < devices.size();
  }

  // Takes `bytes` of device `dev`, or CUDA_ERROR_OUT_OF_MEMORY.
  CUresult Take(int dev, uint64_t bytes) {
    Device& d = devices[dev];
    if (bytes > d.total - std::min(d.total, d.used + d.other)) return CUDA_ERROR_OUT_OF_MEMORY;
    d.used += bytes;
    return CUDA_SUCCESS;
  }
  void Give(int dev, uint64_t bytes) { devices[dev].used -= std::min(devices[dev].used, bytes); }

  bool Known(CUctx_st* ctx) {
    if (ctx == nullptr) return false;
    if (ctx->primary) return devices[ctx->dev].primary_refs > 0;
    return contexts.count(ctx) != 0;
  }

  // [CTX] cuCtxDestroy / cuDevicePrimaryCtxReset: the context's allocations, arrays and modules
  // go with it. VMM memory (cuMemCreate) is not a context's and outlives it.
  void DropContext(CUctx_st* ctx) {
    for (auto it = pointers.begin(); it != pointers.end();) {
      if (it->second.ctx == ctx && it->second.pool == nullptr) {
        Give(it->second.dev, it->second.bytes);
        addresses.Give(it->first, it->second.bytes);
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
    for (auto it = library_loads.begin(); it != library_loads.end();) {
      if (it->second.ctx == ctx) {
        Give(it->second.dev, it->second.bytes);
        it = library_loads.erase(it);
      } else {
        ++it;
      }
    }
    Give(ctx->dev, context_bytes + ctx->limit_bytes);
    ctx->limit_bytes = 0;
    const CUctx_st defaults{};
    std::copy(std::begin(defaults.limits), std::end(defaults.limits), std::begin(ctx->limits));
  }

  // [SOMA] cuMemPoolTrimTo: releases reserved memory the pool does not use, down to `keep`.
  void Trim(CUmemPoolHandle_st* pool, uint64_t keep) {
    const uint64_t target = std::max(pool->used, keep);
    if (pool->reserved > target) {
      Give(pool->dev, pool->reserved - target);
      pool->reserved = target;
    }
  }

  // [SOMA] the pool grows when its free reserved memory does not cover a request (in the model's
  // 2 MiB steps) and hands out blocks rounded to 512 bytes.
  CUresult AllocFromPool(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUctx_st* ctx) {
    if (dptr == nullptr || bytes == 0 || pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const uint64_t size = RoundUp(bytes, kLinearAlign);
    const uint64_t cached = pool->reserved - pool->used;
    if (size > cached) {
      const uint64_t grow = RoundUp(size - cached, kPoolGrowth);
      if (CUresult rc = Take(pool->dev, grow); rc != CUDA_SUCCESS) return rc;
      pool->reserved += grow;
    }
    pool->used += size;
    *dptr = addresses.Take(size);
    pointers[*dptr] = Allocation{pool->dev, size, ctx, pool};
    return CUDA_SUCCESS;
  }

  CUresult Free(CUdeviceptr dptr) {
    auto it = pointers.find(dptr);
    if (it != pointers.end()) {
      if (CUmemPoolHandle_st* pool = it->second.pool; pool != nullptr) {
        pool->used -= it->second.bytes;            // [SOMA] kept by the pool until released
        if (pool->destroyed && pool->used == 0) {  // its last allocation: the pool goes now
          Give(pool->dev, pool->reserved);
          dying_pools.erase(pool);
        }
      } else {
        Give(it->second.dev, it->second.bytes);
      }
      addresses.Give(dptr, it->second.bytes);
      pointers.erase(it);
      return CUDA_SUCCESS;
    }
    // [GRAPH] an allocation a graph made and did not free is freed by cuMemFree(Async); its
    // memory goes back to the graphs' allocator, which keeps it until trimmed.
    auto g = graph_allocations.find(dptr);
    if (g != graph_allocations.end() && g->second.live && !g->second.freed_in_graph) {
      g->second.live = false;
      devices[g->second.dev].graph_used -= g->second.bytes;
      if (g->second.graph == nullptr) {  // its node is gone: the address goes too
        addresses.Give(dptr, g->second.bytes);
        graph_allocations.erase(g);
      }
      return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
  }

  // [SOMA] CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: above the threshold, a pool releases memory at the
  // next stream, event or context synchronization.
  void Synchronize() {
    for (auto& d : devices) Trim(d.default_pool.get(), d.default_pool->threshold);
    for (auto& [p, pool] : pools) Trim(pool.get(), pool->threshold);
  }

  // [VMM] cuMemRelease / cuMemUnmap: the memory is freed when no handle (imported ones
  // included) and no mapping refers to it any more.
  // [VMM] cuMemRelease: "the memory is freed when all outstanding mappings to the memory are
  // unmapped and when all outstanding references to the handle (including its shareable
  // counterparts) are also released". A POSIX descriptor from cuMemExportToShareableHandle is
  // such a counterpart: it keeps the memory until it is closed (SweepExported frees it then).
  void MaybeFreePhysical(uint64_t id) {
    auto it = physical.find(id);
    if (it == physical.end() || it->second.handles > 0 || it->second.maps > 0) return;
    if (it->second.exported_inode != 0 &&
        DescriptorOpen(it->second.exported_dev, it->second.exported_inode)) {
      return;
    }
    if (it->second.dev >= 0) Give(it->second.dev, it->second.bytes);
    for (auto h = handles.begin(); h != handles.end();) {
      if (h->second.physical == id) {
        free_handles.push_back(h->first);  // [VMM] handle values are reused once dead
        h = handles.erase(h);
      } else {
        ++h;
      }
    }
    physical.erase(it);
  }

  // Frees the exported memory whose last reference was its descriptor, once that is closed.
  void SweepExported() {
    std::vector<uint64_t> ids;
    for (const auto& [id, p] : physical) {
      if (p.exported_inode != 0 && p.handles == 0 && p.maps == 0) ids.push_back(id);
    }
    for (uint64_t id : ids) MaybeFreePhysical(id);
  }

  CUmemGenericAllocationHandle NewHandle(uint64_t id) {
    CUmemGenericAllocationHandle h;
    if (!free_handles.empty()) {
      h = free_handles.back();
      free_handles.pop_back();
    } else {
      h = next_handle++;
    }
    handles[h] = HandleRef{id, 1};
    ++physical[id].handles;
    return h;
  }

  CUctx_st* StreamContext(CUstream s, CUctx_st* current) {
    auto it = streams.find(s);
    return it == streams.end() ? current : it->second->ctx;
  }
  CUgraph_st* Capturing(CUstream s) {
    auto it = streams.find(s);
    return it == streams.end() ? nullptr : it->second->capture;
  }

  // [GRAPH] a new allocation node: its address is assigned now and fixed for the node's life.
  CUdeviceptr AddAllocNode(CUgraph_st* g, int dev, uint64_t bytes) {
    const uint64_t size = RoundUp(bytes, kGranule);
    const CUdeviceptr p = addresses.Take(size);
    graph_allocations[p] = GraphAllocation{dev, size, g, false, false};
    auto node = std::make_unique<CUgraphNode_st>(CUgraphNode_st{true, p});
    g->nodes.push_back(std::move(node));
    return p;
  }
  CUresult AddFreeNode(CUgraph_st* g, CUdeviceptr p) {
    auto it = graph_allocations.find(p);
    if (it == graph_allocations.end() || it->second.graph != g || it->second.freed_in_graph) {
      return CUDA_ERROR_INVALID_VALUE;  // [GRAPH] cuGraphAddMemFreeNode's INVALID_VALUE cases
    }
    it->second.freed_in_graph = true;
    g->nodes.push_back(std::make_unique<CUgraphNode_st>(CUgraphNode_st{false, p}));
    return CUDA_SUCCESS;
  }

  // [GRAPH] a launch runs the allocation nodes against the graphs' allocator of their device:
  // memory it already holds is reused, more is reserved when it does not suffice. A graph whose
  // allocation from the last launch is still live cannot be launched again.
  CUresult Launch(CUgraph_st* g) {
    for (auto& n : g->nodes) {
      if (n->alloc && graph_allocations[n->dptr].live) return CUDA_ERROR_INVALID_VALUE;
    }
    for (auto& n : g->nodes) {
      GraphAllocation& a = graph_allocations[n->dptr];
      Device& dv = devices[a.dev];
      if (n->alloc) {
        const uint64_t spare = dv.graph_reserved - dv.graph_used;
        if (a.bytes > spare) {
          if (CUresult rc = Take(a.dev, a.bytes - spare); rc != CUDA_SUCCESS) return rc;
          dv.graph_reserved += a.bytes - spare;
        }
        dv.graph_used += a.bytes;
        a.live = true;
      } else if (a.live) {
        a.live = false;
        dv.graph_used -= a.bytes;
      }
    }
    return CUDA_SUCCESS;
  }
};

Driver* g_driver = nullptr;

void ForkChild();

Driver& D() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_driver = new Driver();  // never destroyed: calls may come during exit
    pthread_atfork(nullptr, nullptr, &ForkChild);
  });
  return *g_driver;
}

thread_local std::vector<CUctx_st*> tl_stack;

// [CTX] CUDA state does not survive fork(): the child starts with a driver of its own.
void ForkChild() {
  g_driver = new Driver();  // the parent's may be locked by a thread that does not exist here
  tl_stack.clear();
}

CUctx_st* Current() { return tl_stack.empty() ? nullptr : tl_stack.back(); }

void Fire(const char* event, unsigned long long value) {
  if (Hook h = __atomic_load_n(&g_hook, __ATOMIC_ACQUIRE)) h(event, value);
}

// Every entry point but cuInit, cuDriverGetVersion and cuGetProcAddress needs cuInit first.
#define SIM_LOCK()            \
  Driver& d = D();            \
  std::lock_guard lock(d.mu); \
  if (!d.initialized) return CUDA_ERROR_NOT_INITIALIZED

#define SIM_CONTEXT()        \
  CUctx_st* ctx = Current(); \
  if (ctx == nullptr || !d.Known(ctx)) return CUDA_ERROR_INVALID_CONTEXT

// The model's array formats, written from the CUarray_format documentation: bytes of one
// block, the block's width and height in elements, and whether the bytes are per channel.
struct Format {
  uint64_t bytes, w, h;
  bool per_channel;
};
bool FormatOf(CUarray_format f, Format* out) {
  const unsigned v = static_cast<unsigned>(f);
  if (v == 0x01 || v == 0x08)
    *out = {1, 1, 1, true};
  else if (v == 0x02 || v == 0x09 || v == 0x10)
    *out = {2, 1, 1, true};
  else if (v == 0x03 || v == 0x0a || v == 0x20)
    *out = {4, 1, 1, true};
  else if (v == 0xc0 || v == 0xc6)
    *out = {1, 1, 1, false};
  else if (v == 0xc1 || v == 0xc7 || v == 0xc3 || v == 0xc9)
    *out = {2, 1, 1, false};
  else if (v == 0xc2 || v == 0xc8 || v == 0xc4 || v == 0xca)
    *out = {4, 1, 1, false};
  else if (v == 0xc5 || v == 0xcb)
    *out = {8, 1, 1, false};
  else if (v == 0x91 || v == 0x92 || v == 0x97 || v == 0x98)
    *out = {8, 4, 4, false};
  else if (v >= 0x93 && v <= 0x9e)
    *out = {16, 4, 4, false};
  else if (v == 0xb0)
    *out = {6, 2, 2, false};  // NV12: luma plane + half-size chroma
  else
    return false;
  return true;
}

// The model's array layout (the reference does not give one; the driver's own is opaque): rows
// of blocks padded to a 512-byte pitch, slices stacked, the whole in 64 KiB pages. Only
// cuArrayGetMemoryRequirements on a deferred-mapping array tells a program this size.
uint64_t ArrayFootprint(size_t w, size_t h, size_t z, const Format& f, unsigned channels) {
  const uint64_t blocks_w = (std::max<uint64_t>(w, 1) + f.w - 1) / f.w;
  const uint64_t rows = (std::max<uint64_t>(h, 1) + f.h - 1) / f.h;
  const uint64_t row = RoundUp(blocks_w * f.bytes * (f.per_channel ? channels : 1), 512);
  return RoundUp(row * rows * std::max<uint64_t>(z, 1), 0x10000);
}

const char kExportTableMagic[16] = "gpulet-sim-etbl";

}  // namespace
}  // namespace gpulet::cudasim

using gpulet::cudasim::Current;
using gpulet::cudasim::D;
using gpulet::cudasim::Driver;
using gpulet::cudasim::Fire;
using gpulet::cudasim::kMiB;
using gpulet::cudasim::tl_stack;

SIM_EXPORT CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard lock(d.mu);
  const CUresult rc = d.Load();
  if (rc == CUDA_SUCCESS) d.initialized = true;
  return rc;
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
CUresult CreateContextLocked(CUcontext* pctx, CUdevice dev) {
  SIM_LOCK();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!d.ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (CUresult rc = d.Take(dev, d.context_bytes); rc != CUDA_SUCCESS) return rc;
  auto ctx = std::make_unique<CUctx_st>(CUctx_st{dev, false});
  *pctx = ctx.get();
  tl_stack.push_back(ctx.get());  // [CTX] cuCtxCreate pushes the new context
  d.contexts.emplace(ctx.get(), std::move(ctx));
  return CUDA_SUCCESS;
}
CUresult CreateContext(CUcontext* pctx, CUdevice dev) {
  const CUresult rc = CreateContextLocked(pctx, dev);
  if (rc == CUDA_SUCCESS) Fire("ctx_create", static_cast<unsigned long long>(dev));
  return rc;
}

CUresult DestroyContextLocked(CUcontext ctx) {
  SIM_LOCK();
  auto it = d.contexts.find(ctx);
  if (it == d.contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  d.DropContext(ctx);
  std::erase(tl_stack, ctx);
  d.contexts.erase(it);
  return CUDA_SUCCESS;
}
CUresult DestroyContext(CUcontext ctx) {
  const CUresult rc = DestroyContextLocked(ctx);
  if (rc == CUDA_SUCCESS) Fire("ctx_destroy", reinterpret_cast<uintptr_t>(ctx));
  return rc;
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

// [CTX] the primary context takes its memory when its first retain creates it.
SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  bool created = false;
  {
    SIM_LOCK();
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!d.ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
    auto& dv = d.devices[dev];
    if (dv.primary_refs == 0) {
      if (CUresult rc = d.Take(dev, d.context_bytes); rc != CUDA_SUCCESS) return rc;
      created = true;
    }
    ++dv.primary_refs;
    *pctx = dv.primary.get();
  }
  if (created) Fire("primary_create", static_cast<unsigned long long>(dev));
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
  *pctx = Current();
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  SIM_LOCK();
  if (ctx != nullptr && !d.Known(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (!tl_stack.empty()) tl_stack.pop_back();
  if (ctx != nullptr) tl_stack.push_back(ctx);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  SIM_LOCK();
  if (ctx == nullptr || !d.Known(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  tl_stack.push_back(ctx);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  SIM_LOCK();
  if (tl_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = tl_stack.back();
  tl_stack.pop_back();
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxSynchronize(void) {
  SIM_LOCK();
  SIM_CONTEXT();
  d.Synchronize();
  return CUDA_SUCCESS;
}

// CUDA 13's variant, what cuGetProcAddress answers for "cuCtxSynchronize" at version 13000 and
// later: the context named, or the current one when none is.
SIM_EXPORT CUresult cuCtxSynchronize_v2(CUcontext named) {
  SIM_LOCK();
  CUctx_st* ctx = named != nullptr ? named : Current();
  if (ctx == nullptr || !d.Known(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  d.Synchronize();
  return CUDA_SUCCESS;
}

// ---- streams and events ------------------------------------------------------------------------

SIM_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (phStream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto s = std::make_unique<CUstream_st>();
  s->ctx = ctx;
  *phStream = s.get();
  d.streams.emplace(s.get(), std::move(s));
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  SIM_LOCK();
  auto it = d.streams.find(hStream);
  if (it == d.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  d.streams.erase(it);
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  SIM_LOCK();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = d.StreamContext(hStream, Current());
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *pctx = ctx;
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

SIM_EXPORT CUresult cuEventCreate(CUevent* phEvent, unsigned int) {
  SIM_LOCK();
  if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto e = std::make_unique<CUevent_st>();
  *phEvent = e.get();
  d.events.emplace(e.get(), std::move(e));
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
  SIM_LOCK();
  return d.events.erase(hEvent) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
SIM_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  SIM_LOCK();
  if (d.events.count(hEvent) == 0) return CUDA_ERROR_INVALID_HANDLE;
  d.Synchronize();  // [SOMA] event synchronization releases pool memory too
  return CUDA_SUCCESS;
}

// ---- linear memory -----------------------------------------------------------------------------

namespace {
CUresult AllocLinear(CUdeviceptr* dptr, uint64_t bytes) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t size = gpulet::cudasim::RoundUp(bytes, gpulet::cudasim::kLinearAlign);
  if (CUresult rc = d.Take(ctx->dev, size); rc != CUDA_SUCCESS) return rc;
  *dptr = d.addresses.Take(size);
  d.pointers[*dptr] = gpulet::cudasim::Allocation{ctx->dev, size, ctx, nullptr};
  return CUDA_SUCCESS;
}
CUresult FreeLocked(CUdeviceptr dptr) {
  SIM_LOCK();
  return d.Free(dptr);
}
}  // namespace

SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return AllocLinear(dptr, bytesize);
}

SIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes,
                                       size_t Height, unsigned int ElementSizeBytes) {
  if (pPitch == nullptr || WidthInBytes == 0 || Height == 0 ||
      (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t pitch = (WidthInBytes + 511) / 512 * 512;
  const CUresult rc = AllocLinear(dptr, pitch * Height);
  if (rc == CUDA_SUCCESS) *pPitch = pitch;
  return rc;
}

SIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  if (flags == 0) return CUDA_ERROR_INVALID_VALUE;
  return AllocLinear(dptr, bytesize);
}

// A variant the memory-limit library does not know: the model's stand-in for an entry point a
// newer driver adds ([GPA]: cuGetProcAddress hands out the newest variant the caller's version
// allows). Only reachable through cuGetProcAddress.
extern "C" CUresult cuMemAllocManaged_v2(CUdeviceptr* dptr, size_t bytesize, unsigned int flags);
SIM_EXPORT CUresult cuMemAllocManaged_v2(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  if (flags == 0) return CUDA_ERROR_INVALID_VALUE;
  return AllocLinear(dptr, bytesize);
}

// [MEM] cuMemFree: the address may be handed out again as soon as it returns.
SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  const CUresult rc = FreeLocked(dptr);
  if (rc == CUDA_SUCCESS) Fire("free", dptr);
  return rc;
}

SIM_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto& dv = d.devices[ctx->dev];
  *total = dv.total;
  *free = dv.total - std::min(dv.total, dv.used + dv.other);  // GPU-wide, every tenant's use
  return CUDA_SUCCESS;
}

// ---- virtual memory management -----------------------------------------------------------------

namespace {
CUresult ReleaseLocked(CUmemGenericAllocationHandle handle) {
  SIM_LOCK();
  auto it = d.handles.find(handle);
  if (it == d.handles.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t id = it->second.physical;
  if (--it->second.refs == 0) --d.physical[id].handles;
  d.MaybeFreePhysical(id);
  return CUDA_SUCCESS;
}
}  // namespace

// [VMM] cuMemCreate: physical memory of `size` (a multiple of the granularity; the model's is
// 2 MiB) on the location `prop` names.
SIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                const CUmemAllocationProp* prop, unsigned long long flags) {
  SIM_LOCK();
  if (handle == nullptr || prop == nullptr || flags != 0 || size == 0 ||
      size % gpulet::cudasim::kGranule != 0) {
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
  const uint64_t id = d.next_physical++;
  d.physical[id] = gpulet::cudasim::Physical{dev, size, 0, 0, 0, 0};
  *handle = d.NewHandle(id);
  d.physical[id].first_handle = *handle;
  return CUDA_SUCCESS;
}

// [VMM] cuMemRelease: the memory is freed once every mapping is unmapped and every reference to
// the handle, imported ones included, is released.
SIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  const CUresult rc = ReleaseLocked(handle);
  if (rc == CUDA_SUCCESS) Fire("release", handle);
  return rc;
}

SIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t, CUdeviceptr,
                                        unsigned long long flags) {
  SIM_LOCK();
  if (ptr == nullptr || size == 0 || flags != 0 || size % gpulet::cudasim::kGranule != 0)
    return CUDA_ERROR_INVALID_VALUE;
  *ptr = d.next_reservation;
  d.next_reservation += size + gpulet::cudasim::kGranule;
  d.reservations[*ptr] = size;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  SIM_LOCK();
  auto it = d.reservations.find(ptr);
  if (it == d.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = d.mappings.lower_bound(ptr);
  if (m != d.mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  d.reservations.erase(it);
  return CUDA_SUCCESS;
}

// [VMM] cuMemMap: maps `size` bytes of the handle's memory (offset 0) into a reserved range; the
// mapping keeps the memory alive.
SIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags) {
  SIM_LOCK();
  auto h = d.handles.find(handle);
  if (h == d.handles.end() || h->second.refs == 0 || offset != 0 || flags != 0 || size == 0)
    return CUDA_ERROR_INVALID_VALUE;
  gpulet::cudasim::Physical& p = d.physical[h->second.physical];
  if (size > p.bytes) return CUDA_ERROR_INVALID_VALUE;
  auto r = d.reservations.upper_bound(ptr);
  if (r == d.reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
  --r;
  if (ptr + size > r->first + r->second) return CUDA_ERROR_INVALID_VALUE;
  auto next = d.mappings.lower_bound(ptr);
  if (next != d.mappings.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != d.mappings.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > ptr) return CUDA_ERROR_INVALID_VALUE;
  }
  d.mappings[ptr] = gpulet::cudasim::Mapping{size, h->second.physical, handle};
  ++p.maps;
  return CUDA_SUCCESS;
}

// [VMM] cuMemUnmap: the range must be whole mappings; memory no handle and no other mapping
// refers to is freed.
SIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  SIM_LOCK();
  auto first = d.mappings.find(ptr);
  if (first == d.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr end = ptr;
  auto last = first;
  for (; last != d.mappings.end() && last->first == end && end < ptr + size; ++last) {
    end += last->second.size;
  }
  if (end != ptr + size) return CUDA_ERROR_INVALID_VALUE;
  std::vector<uint64_t> ids;
  for (auto it = first; it != last; ++it) ids.push_back(it->second.physical);
  d.mappings.erase(first, last);
  for (uint64_t id : ids) {
    --d.physical[id].maps;
    d.MaybeFreePhysical(id);
  }
  return CUDA_SUCCESS;
}

// [VMM] cuMemRetainAllocationHandle: the handle value used to map `addr`, one more reference.
SIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  SIM_LOCK();
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto a = reinterpret_cast<CUdeviceptr>(addr);
  auto m = d.mappings.upper_bound(a);
  if (m == d.mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
  --m;
  if (a >= m->first + m->second.size) return CUDA_ERROR_INVALID_VALUE;
  auto& ref = d.handles[m->second.handle];
  if (ref.refs++ == 0) ++d.physical[m->second.physical].handles;
  ref.physical = m->second.physical;
  *handle = m->second.handle;
  return CUDA_SUCCESS;
}

// [VMM] cuMemExportToShareableHandle (POSIX file descriptor): a descriptor that names the memory.
SIM_EXPORT CUresult cuMemExportToShareableHandle(void* shareableHandle,
                                                 CUmemGenericAllocationHandle handle,
                                                 CUmemAllocationHandleType type,
                                                 unsigned long long flags) {
  SIM_LOCK();
  auto h = d.handles.find(handle);
  if (shareableHandle == nullptr || h == d.handles.end() || h->second.refs == 0 || flags != 0 ||
      type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = ::memfd_create("gpulet-sim-vmm", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  struct stat st {};
  ::fstat(fd, &st);
  d.physical[h->second.physical].exported_inode = st.st_ino;
  d.physical[h->second.physical].exported_dev = st.st_dev;
  std::memcpy(shareableHandle, &fd, sizeof fd);
  return CUDA_SUCCESS;
}

// [VMM] cuMemImportFromShareableHandle: a new handle to the same memory, to be released like any.
SIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                   void* osHandle, CUmemAllocationHandleType type) {
  SIM_LOCK();
  if (handle == nullptr || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_INVALID_VALUE;
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(osHandle));
  struct stat st {};
  if (::fstat(fd, &st) != 0) return CUDA_ERROR_INVALID_VALUE;
  for (auto& [id, p] : d.physical) {
    if (p.exported_inode == st.st_ino) {
      *handle = d.NewHandle(id);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

// ---- stream-ordered allocator ------------------------------------------------------------------

namespace {
// [SOMA] cuMemAllocAsync allocates from the current pool of the stream's device; [GRAPH] on a
// capturing stream it adds an allocation node to the graph instead, and takes no memory.
CUresult AllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream, CUmemoryPool pool) {
  SIM_LOCK();
  CUctx_st* ctx = d.StreamContext(stream, Current());
  if (ctx == nullptr || !d.Known(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (pool != nullptr && d.pools.count(pool) == 0) {
    bool is_default = false;
    for (auto& dv : d.devices) is_default = is_default || dv.default_pool.get() == pool;
    if (!is_default) return CUDA_ERROR_INVALID_VALUE;  // destroyed or never made
  }
  if (CUgraph_st* g = d.Capturing(stream)) {
    const int dev = pool != nullptr ? pool->dev : ctx->dev;
    *dptr = d.AddAllocNode(g, dev, bytesize);
    return CUDA_SUCCESS;
  }
  return d.AllocFromPool(dptr, bytesize, pool != nullptr ? pool : d.devices[ctx->dev].current_pool,
                         ctx);
}
CUresult FreeAsyncLocked(CUdeviceptr dptr, CUstream stream) {
  SIM_LOCK();
  if (CUgraph_st* g = d.Capturing(stream)) return d.AddFreeNode(g, dptr);
  return d.Free(dptr);
}
CUresult FreeAsync(CUdeviceptr dptr, CUstream stream) {
  const CUresult rc = FreeAsyncLocked(dptr, stream);
  if (rc == CUDA_SUCCESS) Fire("free", dptr);
  return rc;
}
}  // namespace

SIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream s) {
  return AllocAsync(dptr, bytesize, s, nullptr);
}
SIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream s) {
  return AllocAsync(dptr, bytesize, s, nullptr);
}
SIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                            CUstream s) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return AllocAsync(dptr, bytesize, s, pool);
}
SIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                 CUmemoryPool pool, CUstream s) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return AllocAsync(dptr, bytesize, s, pool);
}
SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { return FreeAsync(dptr, s); }
SIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { return FreeAsync(dptr, s); }

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

namespace {
// [SOMA] cuMemPoolDestroy: with allocations outstanding it returns at once and the pool's
// resources are released when the last of them is freed; otherwise its memory goes back now.
CUresult PoolDestroyLocked(CUmemoryPool pool) {
  SIM_LOCK();
  auto it = d.pools.find(pool);
  if (it == d.pools.end()) return CUDA_ERROR_INVALID_VALUE;
  for (auto& dv : d.devices) {
    if (dv.current_pool == pool) dv.current_pool = dv.default_pool.get();
  }
  if (pool->used > 0) {
    pool->destroyed = true;
    d.dying_pools.emplace(pool, std::move(it->second));
  } else {
    d.Give(pool->dev, pool->reserved);
  }
  d.pools.erase(it);
  return CUDA_SUCCESS;
}
}  // namespace

SIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  const CUresult rc = PoolDestroyLocked(pool);
  if (rc == CUDA_SUCCESS) Fire("pool_destroy", reinterpret_cast<uintptr_t>(pool));
  return rc;
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

SIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                          void* value) {
  SIM_LOCK();
  if (pool == nullptr || value == nullptr || attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(&pool->threshold, value, sizeof pool->threshold);
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

// ---- graphs ------------------------------------------------------------------------------------

SIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode) {
  SIM_LOCK();
  auto it = d.streams.find(hStream);
  if (it == d.streams.end()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the NULL stream
  if (it->second->capture != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  auto g = std::make_unique<CUgraph_st>();
  it->second->capture = g.get();
  d.graphs.emplace(g.get(), std::move(g));
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return cuStreamBeginCapture_v2(hStream, mode);  // -Bsymbolic: stays inside the model
}

SIM_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  SIM_LOCK();
  auto it = d.streams.find(hStream);
  if (phGraph == nullptr || it == d.streams.end() || it->second->capture == nullptr)
    return CUDA_ERROR_ILLEGAL_STATE;
  *phGraph = it->second->capture;
  it->second->capture = nullptr;
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return cuStreamEndCapture(hStream, phGraph);
}

SIM_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* status) {
  SIM_LOCK();
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *status = d.Capturing(hStream) != nullptr ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                            : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  SIM_LOCK();
  if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto g = std::make_unique<CUgraph_st>();
  *phGraph = g.get();
  d.graphs.emplace(g.get(), std::move(g));
  return CUDA_SUCCESS;
}

// [GRAPH] cuGraphAddMemAllocNode: returns the allocation's address in nodeParams->dptr.
SIM_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                           const CUgraphNode*, size_t,
                                           CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  SIM_LOCK();
  if (phGraphNode == nullptr || nodeParams == nullptr || nodeParams->bytesize == 0 ||
      d.graphs.count(hGraph) == 0 ||
      nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!d.ValidDevice(nodeParams->poolProps.location.id)) return CUDA_ERROR_INVALID_DEVICE;
  nodeParams->dptr =
      d.AddAllocNode(hGraph, nodeParams->poolProps.location.id, nodeParams->bytesize);
  *phGraphNode = hGraph->nodes.back().get();
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                          const CUgraphNode*, size_t, CUdeviceptr dptr) {
  SIM_LOCK();
  if (phGraphNode == nullptr || d.graphs.count(hGraph) == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = d.AddFreeNode(hGraph, dptr); rc != CUDA_SUCCESS) return rc;
  *phGraphNode = hGraph->nodes.back().get();
  return CUDA_SUCCESS;
}

namespace {
// [GRAPH] a graph with memory nodes may have one instantiation at a time.
CUresult Instantiate(CUgraphExec* exec, CUgraph g) {
  SIM_LOCK();
  if (exec == nullptr || d.graphs.count(g) == 0) return CUDA_ERROR_INVALID_VALUE;
  if (g->execs > 0 && !g->nodes.empty()) return CUDA_ERROR_NOT_PERMITTED;
  auto e = std::make_unique<CUgraphExec_st>();
  e->graph = g;
  ++g->execs;
  *exec = e.get();
  d.execs.emplace(e.get(), std::move(e));
  return CUDA_SUCCESS;
}
CUresult Launch(CUgraphExec exec) {
  SIM_LOCK();
  auto it = d.execs.find(exec);
  if (it == d.execs.end() || it->second->graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return d.Launch(it->second->graph);
}
}  // namespace

SIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                unsigned long long) {
  return Instantiate(phGraphExec, hGraph);
}
SIM_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                 CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  const CUresult rc = Instantiate(phGraphExec, hGraph);
  if (params != nullptr) params->result_out = rc == CUDA_SUCCESS ? 0 : 1;
  return rc;
}
SIM_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                      CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return cuGraphInstantiateWithParams(phGraphExec, hGraph, params);
}
// [GRAPH] cuGraphUpload: the launch's resources, memory included, are set up ahead: the model
// reserves nothing there and takes memory at the launch.
SIM_EXPORT CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream) {
  SIM_LOCK();
  return d.execs.count(hGraphExec) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
SIM_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream stream) {
  return cuGraphUpload(hGraphExec, stream);
}
SIM_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream) { return Launch(hGraphExec); }
SIM_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream) {
  return Launch(hGraphExec);
}

SIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  SIM_LOCK();
  auto it = d.execs.find(hGraphExec);
  if (it == d.execs.end()) return CUDA_ERROR_INVALID_VALUE;
  if (it->second->graph != nullptr) --it->second->graph->execs;
  d.execs.erase(it);
  return CUDA_SUCCESS;
}

// [GRAPH] destroying a graph does not free its live allocations: they stay until freed.
SIM_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  SIM_LOCK();
  auto it = d.graphs.find(hGraph);
  if (it == d.graphs.end()) return CUDA_ERROR_INVALID_VALUE;
  for (auto& n : hGraph->nodes) {
    if (!n->alloc) continue;
    auto a = d.graph_allocations.find(n->dptr);
    if (a == d.graph_allocations.end()) continue;
    if (a->second.live && !a->second.freed_in_graph) {
      a->second.graph = nullptr;
    } else {
      if (a->second.live) d.devices[a->second.dev].graph_used -= a->second.bytes;
      d.addresses.Give(a->first, a->second.bytes);
      d.graph_allocations.erase(a);
    }
  }
  for (auto& [e, exec] : d.execs) {
    if (exec->graph == hGraph) exec->graph = nullptr;
  }
  for (auto& [s, stream] : d.streams) {
    if (stream->capture == hGraph) stream->capture = nullptr;
  }
  d.graphs.erase(it);
  return CUDA_SUCCESS;
}

// [GRAPH] cuDeviceGraphMemTrim: memory the graphs' allocator holds and no live allocation uses
// goes back to the device.
SIM_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device) {
  SIM_LOCK();
  if (!d.ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  auto& dv = d.devices[device];
  d.Give(device, dv.graph_reserved - dv.graph_used);
  dv.graph_reserved = dv.graph_used;
  return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                                 void* value) {
  SIM_LOCK();
  if (!d.ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto& dv = d.devices[device];
  uint64_t v = 0;
  if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
    v = dv.graph_used;
  else if (attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
    v = dv.graph_reserved;
  else
    return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(value, &v, sizeof v);
  return CUDA_SUCCESS;
}

// ---- arrays ------------------------------------------------------------------------------------

namespace {
template <typename Handle>
CUresult CreateArray(Handle* out, uint64_t bytes, unsigned flags) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  auto* h = new std::remove_pointer_t<Handle>{ctx->dev};
  if ((flags & (CUDA_ARRAY3D_DEFERRED_MAPPING | CUDA_ARRAY3D_SPARSE)) != 0) {
    d.deferred[h] = bytes;  // no memory until memory is mapped into it
    *out = h;
    return CUDA_SUCCESS;
  }
  if (CUresult rc = d.Take(ctx->dev, bytes); rc != CUDA_SUCCESS) {
    delete h;
    return rc;
  }
  *out = h;
  d.objects[h] = gpulet::cudasim::Allocation{ctx->dev, bytes, ctx, nullptr};
  return CUDA_SUCCESS;
}

template <typename Handle>
CUresult DestroyObjectLocked(Handle h) {
  SIM_LOCK();
  if (d.deferred.erase(h) == 1) {
    delete h;
    return CUDA_SUCCESS;
  }
  auto it = d.objects.find(h);
  if (it == d.objects.end()) return CUDA_ERROR_INVALID_HANDLE;
  d.Give(it->second.dev, it->second.bytes);
  d.objects.erase(it);
  auto [first, last] = d.library_loads.equal_range(h);
  for (auto l = first; l != last; ++l) d.Give(l->second.dev, l->second.bytes);
  d.library_loads.erase(first, last);
  delete h;  // the allocator may hand the same address out for the next object
  return CUDA_SUCCESS;
}
template <typename Handle>
CUresult DestroyObject(Handle h, const char* event) {
  const CUresult rc = DestroyObjectLocked(h);
  if (rc == CUDA_SUCCESS) Fire(event, reinterpret_cast<uintptr_t>(h));
  return rc;
}

// [MEM] cuArrayGetMemoryRequirements: for an array made with CUDA_ARRAY3D_DEFERRED_MAPPING;
// any other answers CUDA_ERROR_INVALID_VALUE.
template <typename Handle>
CUresult Requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* r, Handle h, CUdevice dev) {
  SIM_LOCK();
  if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = d.deferred.find(h);
  if (it == d.deferred.end()) return CUDA_ERROR_INVALID_VALUE;
  if (dev != h->dev) return CUDA_ERROR_INVALID_DEVICE;
  *r = CUDA_ARRAY_MEMORY_REQUIREMENTS{};
  r->size = it->second;
  r->alignment = 0x10000;
  return CUDA_SUCCESS;
}

uint64_t Footprint3D(const CUDA_ARRAY3D_DESCRIPTOR& a, const gpulet::cudasim::Format& f,
                     unsigned levels) {
  const bool layered = (a.Flags & CUDA_ARRAY3D_LAYERED) != 0;
  const bool cube = (a.Flags & CUDA_ARRAY3D_CUBEMAP) != 0;
  uint64_t bytes = 0;
  for (unsigned l = 0; l < levels && l < 64; ++l) {
    const size_t w = std::max<size_t>(a.Width >> l, 1);
    const size_t h = a.Height == 0 ? 0 : std::max<size_t>(a.Height >> l, 1);
    const size_t z = a.Depth == 0      ? 0
                     : layered || cube ? a.Depth
                                       : std::max<size_t>(a.Depth >> l, 1);
    bytes += gpulet::cudasim::ArrayFootprint(w, h, z, f, a.NumChannels);
  }
  return bytes;
}
}  // namespace

SIM_EXPORT CUresult cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* a) {
  gpulet::cudasim::Format f{};
  if (a == nullptr || !gpulet::cudasim::FormatOf(a->Format, &f) || a->Width == 0)
    return CUDA_ERROR_INVALID_VALUE;
  return CreateArray(pHandle,
                     gpulet::cudasim::ArrayFootprint(a->Width, a->Height, 0, f, a->NumChannels), 0);
}

SIM_EXPORT CUresult cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* a) {
  gpulet::cudasim::Format f{};
  if (a == nullptr || !gpulet::cudasim::FormatOf(a->Format, &f) || a->Width == 0)
    return CUDA_ERROR_INVALID_VALUE;
  return CreateArray(pHandle, Footprint3D(*a, f, 1), a->Flags);
}

SIM_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* pHandle,
                                           const CUDA_ARRAY3D_DESCRIPTOR* a, unsigned int levels) {
  gpulet::cudasim::Format f{};
  if (a == nullptr || !gpulet::cudasim::FormatOf(a->Format, &f) || a->Width == 0 || levels == 0)
    return CUDA_ERROR_INVALID_VALUE;
  return CreateArray(pHandle, Footprint3D(*a, f, levels), a->Flags);
}

SIM_EXPORT CUresult cuArrayDestroy(CUarray h) { return DestroyObject(h, "array_destroy"); }
SIM_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) {
  return DestroyObject(h, "array_destroy");
}
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
CUresult LoadObjectLocked(Handle* out, const void* image) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (out == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = d.Take(ctx->dev, d.module_bytes); rc != CUDA_SUCCESS) return rc;
  auto* h = new std::remove_pointer_t<Handle>{ctx};
  *out = h;
  d.objects[h] = gpulet::cudasim::Allocation{ctx->dev, d.module_bytes, ctx, nullptr};
  return CUDA_SUCCESS;
}
// [MOD] the module's code and data take device memory at the load.
template <typename Handle>
CUresult LoadObject(Handle* out, const void* image) {
  const CUresult rc = LoadObjectLocked(out, image);
  if (rc == CUDA_SUCCESS) Fire("module_load", reinterpret_cast<uintptr_t>(*out));
  return rc;
}
}  // namespace

SIM_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return LoadObject(module, image);
}
SIM_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int,
                                       CUjit_option*, void**) {
  return LoadObject(module, image);
}
SIM_EXPORT CUresult cuModuleUnload(CUmodule h) { return DestroyObject(h, "module_unload"); }
// [MOD] Library Management, cuLibraryLoadData: context-independent loading. With a context
// current the model loads into it (as a module load); with none, the library is loaded "eagerly
// into all contexts at the time of the call" (the EAGER module loading mode; contexts created
// later are not modelled): every live context takes the image's memory now.
namespace {
CUresult LoadLibraryLocked(CUlibrary* out, const void* code) {
  SIM_LOCK();
  if (out == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUctx_st*> live;
  if (CUctx_st* ctx = Current(); ctx != nullptr && d.Known(ctx)) {
    live.push_back(ctx);
  } else {
    for (auto& dv : d.devices) {
      if (dv.primary && dv.primary_refs > 0) live.push_back(dv.primary.get());
    }
    for (auto& [c, owned] : d.contexts) live.push_back(c);
  }
  uint64_t taken = 0;
  for (CUctx_st* c : live) {
    if (CUresult rc = d.Take(c->dev, d.module_bytes); rc != CUDA_SUCCESS) {
      for (size_t i = 0; i < taken; ++i) d.Give(live[i]->dev, d.module_bytes);
      return rc;
    }
    ++taken;
  }
  auto* h = new CUlib_st{live.empty() ? nullptr : live[0]};
  *out = h;
  if (live.empty()) {
    d.objects[h] = gpulet::cudasim::Allocation{0, 0, nullptr, nullptr};
  } else {
    d.objects[h] = gpulet::cudasim::Allocation{live[0]->dev, d.module_bytes, live[0], nullptr};
  }
  for (size_t i = 1; i < live.size(); ++i) {
    d.library_loads.emplace(
        h, gpulet::cudasim::Allocation{live[i]->dev, d.module_bytes, live[i], nullptr});
  }
  return CUDA_SUCCESS;
}
}  // namespace
SIM_EXPORT CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option*, void**,
                                      unsigned int, void*, void**, unsigned int) {
  const CUresult rc = LoadLibraryLocked(library, code);
  if (rc == CUDA_SUCCESS) Fire("module_load", reinterpret_cast<uintptr_t>(*library));
  return rc;
}
SIM_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* fileName, CUjit_option*,
                                          void**, unsigned int, void*, void**, unsigned int) {
  const CUresult rc = LoadLibraryLocked(library, fileName);
  if (rc == CUDA_SUCCESS) Fire("module_load", reinterpret_cast<uintptr_t>(*library));
  return rc;
}
SIM_EXPORT CUresult cuLibraryUnload(CUlibrary h) { return DestroyObject(h, "module_unload"); }
// [MOD] cuModuleLoad (a file) and cuModuleLoadFatBinary load the same kind of image as
// cuModuleLoadData and take the same device memory at the load (cuLibraryLoadFromFile: below,
// with cuLibraryLoadData).
SIM_EXPORT CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  return LoadObject(module, fname);
}
SIM_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return LoadObject(module, fatCubin);
}


// [CTX] cuCtxSetLimit: the device malloc heap (CU_LIMIT_MALLOC_HEAP_SIZE), the printf FIFO and
// the per-thread stack are device memory the driver reserves when the limit is set ("the driver
// will reserve ... the heap"; the stack for every thread that can be resident). The model's
// choice: a context's memory covers the defaults; past them the heap and FIFO take their size,
// the stack its size times 65,536 resident threads, device-runtime depths and counts 1 MiB each.
namespace {
uint64_t LimitFootprint(const size_t (&v)[5]) {
  const size_t d[5] = {1024, 1 << 20, 8 << 20, 2, 2048};
  auto over = [&](int i) -> uint64_t { return v[i] > d[i] ? v[i] - d[i] : 0; };
  return over(0) * 65536 + over(1) + over(2) + (over(3) + over(4)) * (1 << 20);
}
}  // namespace
SIM_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (static_cast<int>(limit) < 0 || static_cast<int>(limit) > 6) return CUDA_ERROR_INVALID_VALUE;
  if (static_cast<int>(limit) >= 5) return CUDA_SUCCESS;  // caches: no device memory
  size_t next[5];
  std::copy(std::begin(ctx->limits), std::end(ctx->limits), next);
  next[limit] = value;
  const uint64_t now = LimitFootprint(next);
  if (now > ctx->limit_bytes) {
    if (CUresult rc = d.Take(ctx->dev, now - ctx->limit_bytes); rc != CUDA_SUCCESS) return rc;
  } else {
    d.Give(ctx->dev, ctx->limit_bytes - now);
  }
  ctx->limit_bytes = now;
  ctx->limits[limit] = value;
  return CUDA_SUCCESS;
}
SIM_EXPORT CUresult cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
  SIM_LOCK();
  SIM_CONTEXT();
  if (pvalue == nullptr || static_cast<int>(limit) < 0 || static_cast<int>(limit) > 6)
    return CUDA_ERROR_INVALID_VALUE;
  *pvalue = static_cast<int>(limit) < 5 ? ctx->limits[limit] : 0;
  return CUDA_SUCCESS;
}

// [CTX] Green Contexts (cuGreenCtxCreate, CUDA 12.4): a context of its own on `dev` with the
// resources `desc` names; it is not made current ("the green context is not pushed onto the
// current thread's stack") and takes a context's device memory until cuGreenCtxDestroy.
namespace {
CUresult CreateGreenLocked(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev) {
  SIM_LOCK();
  if (phCtx == nullptr || desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!d.ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (CUresult rc = d.Take(dev, d.context_bytes); rc != CUDA_SUCCESS) return rc;
  auto ctx = std::make_unique<CUctx_st>(CUctx_st{dev, false});
  *phCtx = reinterpret_cast<CUgreenCtx>(ctx.get());
  d.contexts.emplace(ctx.get(), std::move(ctx));
  return CUDA_SUCCESS;
}
}  // namespace
SIM_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev,
                                     unsigned int) {
  const CUresult rc = CreateGreenLocked(phCtx, desc, dev);
  if (rc == CUDA_SUCCESS) Fire("ctx_create", static_cast<unsigned long long>(dev));
  return rc;
}
SIM_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx hCtx) {
  return DestroyContext(reinterpret_cast<CUcontext>(hCtx));
}

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

extern "C" CUresult cuGetProcAddress(const char*, void**, int, cuuint64_t);
extern "C" CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t,
                                        CUdriverProcAddressQueryResult*);

namespace {
struct Entry {
  const char* base;
  const char* name;
  int since;
  bool ptsz;
  void* fn;
};

// The model's own table of every entry point it exports: the base name cuGetProcAddress knows
// it by, the CUDA version that introduced the variant, whether it is the per-thread default
// stream twin. Written here, not derived from the library's list, and with a variant the
// library does not know (cuMemAllocManaged_v2).
#define E(base, name, since, ptsz) \
  { #base, #name, since, ptsz, reinterpret_cast < void*>(&::name) }
const Entry kEntries[] = {
    E(cuInit, cuInit, 2000, false),
    E(cuDriverGetVersion, cuDriverGetVersion, 2020, false),
    E(cuGetProcAddress, cuGetProcAddress, 11030, false),
    E(cuGetProcAddress, cuGetProcAddress_v2, 12000, false),
    E(cuGetExportTable, cuGetExportTable, 3000, false),
    E(cuDeviceGet, cuDeviceGet, 2000, false),
    E(cuDeviceGetCount, cuDeviceGetCount, 2000, false),
    E(cuDeviceGetUuid, cuDeviceGetUuid, 9020, false),
    E(cuDeviceGetUuid, cuDeviceGetUuid_v2, 11040, false),
    E(cuDeviceTotalMem, cuDeviceTotalMem_v2, 3020, false),
    E(cuCtxCreate, cuCtxCreate_v2, 3020, false),
    E(cuCtxCreate, cuCtxCreate_v3, 11040, false),
    E(cuCtxCreate, cuCtxCreate_v4, 12050, false),
    E(cuCtxDestroy, cuCtxDestroy, 2000, false),
    E(cuCtxDestroy, cuCtxDestroy_v2, 4000, false),
    E(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, false),
    E(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, 7000, false),
    E(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, 11000, false),
    E(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, 7000, false),
    E(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, 11000, false),
    E(cuCtxGetDevice, cuCtxGetDevice, 2000, false),
    E(cuCtxGetCurrent, cuCtxGetCurrent, 4000, false),
    E(cuCtxSetCurrent, cuCtxSetCurrent, 4000, false),
    E(cuCtxPushCurrent, cuCtxPushCurrent_v2, 4000, false),
    E(cuCtxPopCurrent, cuCtxPopCurrent_v2, 4000, false),
    E(cuCtxSynchronize, cuCtxSynchronize, 2000, false),
    E(cuCtxSynchronize, cuCtxSynchronize_v2, 13000, false),
    E(cuStreamCreate, cuStreamCreate, 2000, false),
    E(cuStreamDestroy, cuStreamDestroy_v2, 4000, false),
    E(cuStreamGetCtx, cuStreamGetCtx, 9020, false),
    E(cuStreamSynchronize, cuStreamSynchronize, 2000, false),
    E(cuStreamSynchronize, cuStreamSynchronize_ptsz, 7000, true),
    E(cuStreamBeginCapture, cuStreamBeginCapture_v2, 10010, false),
    E(cuStreamBeginCapture, cuStreamBeginCapture_v2_ptsz, 10010, true),
    E(cuStreamEndCapture, cuStreamEndCapture, 10000, false),
    E(cuStreamEndCapture, cuStreamEndCapture_ptsz, 10000, true),
    E(cuStreamIsCapturing, cuStreamIsCapturing, 10000, false),
    E(cuEventCreate, cuEventCreate, 2000, false),
    E(cuEventDestroy, cuEventDestroy_v2, 4000, false),
    E(cuEventSynchronize, cuEventSynchronize, 2000, false),
    E(cuMemAlloc, cuMemAlloc_v2, 3020, false),
    E(cuMemAllocPitch, cuMemAllocPitch_v2, 3020, false),
    E(cuMemAllocManaged, cuMemAllocManaged, 6000, false),
    E(cuMemAllocManaged, cuMemAllocManaged_v2, 12030, false),
    E(cuMemFree, cuMemFree_v2, 3020, false),
    E(cuMemGetInfo, cuMemGetInfo_v2, 3020, false),
    E(cuMemCreate, cuMemCreate, 10020, false),
    E(cuMemRelease, cuMemRelease, 10020, false),
    E(cuMemAddressReserve, cuMemAddressReserve, 10020, false),
    E(cuMemAddressFree, cuMemAddressFree, 10020, false),
    E(cuMemMap, cuMemMap, 10020, false),
    E(cuMemUnmap, cuMemUnmap, 10020, false),
    E(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, false),
    E(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, false),
    E(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020, false),
    E(cuMemAllocAsync, cuMemAllocAsync, 11020, false),
    E(cuMemAllocAsync, cuMemAllocAsync_ptsz, 11020, true),
    E(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, false),
    E(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz, 11020, true),
    E(cuMemFreeAsync, cuMemFreeAsync, 11020, false),
    E(cuMemFreeAsync, cuMemFreeAsync_ptsz, 11020, true),
    E(cuMemPoolCreate, cuMemPoolCreate, 11020, false),
    E(cuMemPoolDestroy, cuMemPoolDestroy, 11020, false),
    E(cuMemPoolTrimTo, cuMemPoolTrimTo, 11020, false),
    E(cuMemPoolGetAttribute, cuMemPoolGetAttribute, 11020, false),
    E(cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, false),
    E(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 11020, false),
    E(cuDeviceGetMemPool, cuDeviceGetMemPool, 11020, false),
    E(cuArrayCreate, cuArrayCreate_v2, 3020, false),
    E(cuArray3DCreate, cuArray3DCreate_v2, 3020, false),
    E(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, false),
    E(cuArrayDestroy, cuArrayDestroy, 2000, false),
    E(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, false),
    E(cuArrayGetMemoryRequirements, cuArrayGetMemoryRequirements, 11060, false),
    E(cuMipmappedArrayGetMemoryRequirements, cuMipmappedArrayGetMemoryRequirements, 11060, false),
    E(cuModuleLoadData, cuModuleLoadData, 2000, false),
    E(cuModuleLoadDataEx, cuModuleLoadDataEx, 2010, false),
    E(cuModuleUnload, cuModuleUnload, 2000, false),
    E(cuLibraryLoadData, cuLibraryLoadData, 12000, false),
    E(cuLibraryUnload, cuLibraryUnload, 12000, false),
    E(cuModuleLoad, cuModuleLoad, 2000, false),
    E(cuModuleLoadFatBinary, cuModuleLoadFatBinary, 2000, false),
    E(cuLibraryLoadFromFile, cuLibraryLoadFromFile, 12000, false),
    E(cuGreenCtxCreate, cuGreenCtxCreate, 12040, false),
    E(cuGreenCtxDestroy, cuGreenCtxDestroy, 12040, false),
    E(cuCtxSetLimit, cuCtxSetLimit, 3010, false),
    E(cuCtxGetLimit, cuCtxGetLimit, 3010, false),
    E(cuLaunchKernel, cuLaunchKernel, 4000, false),
    E(cuGraphCreate, cuGraphCreate, 10000, false),
    E(cuGraphDestroy, cuGraphDestroy, 10000, false),
    E(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, false),
    E(cuGraphAddMemFreeNode, cuGraphAddMemFreeNode, 11040, false),
    E(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, false),
    E(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, false),
    E(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz, 12000, true),
    E(cuGraphUpload, cuGraphUpload, 11010, false),
    E(cuGraphUpload, cuGraphUpload_ptsz, 11010, true),
    E(cuGraphLaunch, cuGraphLaunch, 10000, false),
    E(cuGraphLaunch, cuGraphLaunch_ptsz, 10000, true),
    E(cuGraphExecDestroy, cuGraphExecDestroy, 10000, false),
    E(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, 11040, false),
    E(cuDeviceGetGraphMemAttribute, cuDeviceGetGraphMemAttribute, 11040, false),
};
#undef E

// [GPA] the newest variant of `symbol` that both `cuda_version` and this driver know; the
// per-thread default stream twin when the caller asks for it. An exact exported name that is no
// base name ("cuMemAlloc_v2") is accepted too.
CUresult ProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                     CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int driver = 0;
  if (cuDriverGetVersion(&driver) != CUDA_SUCCESS) driver = cuda_version;
  const int limit = std::min(cuda_version, driver);
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const Entry* best = nullptr;
  bool known = false;
  for (const Entry& e : kEntries) {
    if (std::strcmp(e.base, symbol) != 0) continue;
    known = true;
    if (e.since > limit) continue;
    if (e.ptsz && !per_thread) continue;
    if (best == nullptr || (e.ptsz && !best->ptsz) ||
        (e.ptsz == best->ptsz && e.since > best->since)) {
      best = &e;
    }
  }
  if (!known) {
    for (const Entry& e : kEntries) {
      if (std::strcmp(e.name, symbol) == 0) best = &e;
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

// ---- test hooks (not the driver API) -----------------------------------------------------------

// Device memory this process's driver holds on `dev` (contexts, allocations, pools, VMM, graphs,
// arrays, modules): what the memory-limit library should have charged.
SIM_EXPORT unsigned long long gpulet_sim_device_used(int dev) {
  Driver& d = D();
  std::lock_guard lock(d.mu);
  if (dev < 0 || static_cast<size_t>(dev) >= d.devices.size()) return 0;
  d.SweepExported();  // what the driver holds now: descriptors closed since are gone
  return d.devices[dev].used;
}

// Another tenant of the GPU takes (delta > 0) or gives back device memory: it shows in
// cuMemGetInfo's free memory, not in this process's use.
SIM_EXPORT void gpulet_sim_neighbour(int dev, long long delta) {
  Driver& d = D();
  std::lock_guard lock(d.mu);
  if (dev < 0 || static_cast<size_t>(dev) >= d.devices.size()) return;
  auto& dv = d.devices[dev];
  dv.other = delta < 0 ? dv.other - std::min<uint64_t>(dv.other, static_cast<uint64_t>(-delta))
                       : dv.other + static_cast<uint64_t>(delta);
}

// Called after a successful release or load, outside the driver's lock, with what was released
// ("free", "release", "array_destroy", "module_unload", "ctx_destroy", "pool_destroy") or made
// ("module_load", "ctx_create", "primary_create"): a test makes another thread act right there.
SIM_EXPORT void gpulet_sim_set_hook(void (*hook)(const char* event, unsigned long long value)) {
  __atomic_store_n(&gpulet::cudasim::g_hook, hook, __ATOMIC_RELEASE);
}
