// The memory-limit library against the driver model (testing/cuda_sim): a program linked against
// the simulated libcuda.so.1 and run under LD_PRELOAD=libgpulet-cuda.so. After every step it
// compares what the library charged (the accounting region) with what the model's driver holds
// (gpulet_sim_device_used), and checks that the model never holds more than the limit.
//
//   memlimit_model DIR SCENARIO       DIR: the accounting region's directory (GPULET_CUDA_DIR)
//   memlimit_model DIR diff SEED STEPS
// Scenarios (one per escape of issue 24): reuse-race, vmm-mapped, vmm-retain, vmm-import, graph,
// neighbour-module, neighbour-context, stream-device, arrays, procaddr, retain-race,
// pool-destroyed; and of issue 36: driver-first (MODEL_POISON: the tenant library's path),
// library-no-context, vmm-exported, ctx-limits.
// Prints "ok …" and exits 0, or "FAIL …" (with the seed and step for diff) and exits 1.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cudashim/cuda_api.h"
#include "cudashim/region.h"

extern "C" unsigned long long gpulet_sim_device_used(int dev);
extern "C" void gpulet_sim_neighbour(int dev, long long delta);
extern "C" void gpulet_sim_set_hook(void (*hook)(const char* event, unsigned long long value));

namespace {

using gpulet::cudashim::Region;
constexpr uint64_t kMiB = 1024ULL * 1024ULL;

std::string g_dir;
uint64_t g_seed = 0;
int64_t g_step = -1;

[[noreturn]] void Fail(const std::string& what) {
  std::printf("FAIL %s seed=%" PRIu64 " step=%" PRId64 "\n", what.c_str(), g_seed, g_step);
  std::fflush(stdout);
  std::_Exit(1);
}

void Ok(CUresult rc, const char* what) {
  if (rc != CUDA_SUCCESS) Fail(std::string(what) + " rc=" + std::to_string(rc));
}

uint64_t Charged(int slot = 0) {
  static Region* r = [] {  // mapped once (shared: a forked child reads the same file)
    auto* region = new Region();
    if (!region->Open(g_dir, /*read_only=*/true).empty()) Fail("cannot open the region");
    return region;
  }();
  return r->Usage().at(slot).used;
}

// Charged == held on `dev` (region slot `slot`), and held within `limit` (+ `slack`: a size the
// driver chose after the library charged, e.g. a pool's growth step).
void Check(const char* where, uint64_t limit, int dev = 0, int slot = 0, uint64_t slack = 0) {
  const uint64_t charged = Charged(slot);
  const uint64_t held = gpulet_sim_device_used(dev);
  if (charged != held) {
    Fail(std::string(where) + ": charged " + std::to_string(charged) + " != driver holds " +
         std::to_string(held));
  }
  if (held > limit + slack) {
    Fail(std::string(where) + ": driver holds " + std::to_string(held) + " past the limit " +
         std::to_string(limit));
  }
}

CUcontext Init(int dev = 0) {
  Ok(cuInit(0), "cuInit");
  CUcontext ctx = nullptr;
  Ok(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  Ok(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  return ctx;
}

// ---- scenarios ---------------------------------------------------------------------------------

std::atomic<int> g_hook_armed{0};
CUdeviceptr g_other = 0;
CUcontext g_ctx = nullptr;

// Issue 24 item 2: thread A frees X; before A's library records the free, thread B is handed X.
void ReuseHook(const char* event, unsigned long long) {
  if (std::strcmp(event, "free") != 0 || g_hook_armed.exchange(0) == 0) return;
  std::thread b([] {
    cuCtxSetCurrent(g_ctx);
    Ok(cuMemAlloc_v2(&g_other, kMiB), "B cuMemAlloc_v2");
  });
  b.join();
}

void ReuseRace(uint64_t limit) {
  g_ctx = Init();
  gpulet_sim_set_hook(&ReuseHook);
  CUdeviceptr a = 0;
  Ok(cuMemAlloc_v2(&a, kMiB), "A cuMemAlloc_v2");
  g_hook_armed = 1;
  Ok(cuMemFree_v2(a), "A cuMemFree_v2");
  if (g_other != a) Fail("the model did not hand A's address to B");
  Check("after B took A's address", limit);
  Ok(cuMemFree_v2(g_other), "B cuMemFree_v2");
  Check("after both freed", limit);
  // The same with arrays (the handle of a destroyed array is the next one's).
  CUDA_ARRAY_DESCRIPTOR d{1024, 1024, CU_AD_FORMAT_FLOAT, 1};
  CUarray x = nullptr, y = nullptr;
  Ok(cuArrayCreate_v2(&x, &d), "cuArrayCreate_v2");
  Ok(cuArrayDestroy(x), "cuArrayDestroy");
  Ok(cuArrayCreate_v2(&y, &d), "cuArrayCreate_v2");
  Ok(cuArrayDestroy(y), "cuArrayDestroy");
  Check("arrays", limit);
  std::printf("ok reuse-race\n");
}

CUmemAllocationProp DeviceProp(int dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  return prop;
}

// Issue 24 item 1: create → map → release (NVIDIA's vectorAddMMAP): the memory lives on.
void VmmMapped(uint64_t limit) {
  Init();
  const CUmemAllocationProp prop = DeviceProp(0);
  const uint64_t chunk = 32 * kMiB;
  std::vector<CUdeviceptr> ranges;
  for (int i = 0; i < 64; ++i) {
    CUmemGenericAllocationHandle h = 0;
    const CUresult rc = cuMemCreate(&h, chunk, &prop, 0);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) break;
    Ok(rc, "cuMemCreate");
    CUdeviceptr va = 0;
    Ok(cuMemAddressReserve(&va, chunk, 0, 0, 0), "cuMemAddressReserve");
    Ok(cuMemMap(va, chunk, 0, h, 0), "cuMemMap");
    Ok(cuMemRelease(h), "cuMemRelease");
    ranges.push_back(va);
    Check("mapped, handle released", limit);
  }
  if (ranges.empty() || ranges.size() == 64) Fail("the limit never stopped cuMemCreate");
  for (CUdeviceptr va : ranges) {
    Ok(cuMemUnmap(va, chunk), "cuMemUnmap");
    Ok(cuMemAddressFree(va, chunk), "cuMemAddressFree");
    Check("unmapped", limit);
  }
  std::printf("ok vmm-mapped ranges=%zu\n", ranges.size());
}

// cuMemRetainAllocationHandle keeps the memory after the last unmap.
void VmmRetain(uint64_t limit) {
  Init();
  const CUmemAllocationProp prop = DeviceProp(0);
  CUmemGenericAllocationHandle h = 0, again = 0;
  CUdeviceptr va = 0;
  Ok(cuMemCreate(&h, 8 * kMiB, &prop, 0), "cuMemCreate");
  Ok(cuMemAddressReserve(&va, 8 * kMiB, 0, 0, 0), "cuMemAddressReserve");
  Ok(cuMemMap(va, 8 * kMiB, 0, h, 0), "cuMemMap");
  Ok(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(va)), "retain");
  Ok(cuMemRelease(h), "cuMemRelease");
  Ok(cuMemUnmap(va, 8 * kMiB), "cuMemUnmap");
  Check("retained, unmapped", limit);
  Ok(cuMemRelease(again), "cuMemRelease (retained)");
  Check("all released", limit);
  std::printf("ok vmm-retain\n");
}

// An import keeps the memory after its exporter released it.
void VmmImport(uint64_t limit) {
  Init();
  const CUmemAllocationProp prop = DeviceProp(0);
  CUmemGenericAllocationHandle h = 0, imported = 0;
  Ok(cuMemCreate(&h, 8 * kMiB, &prop, 0), "cuMemCreate");
  int fd = -1;
  Ok(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "export");
  Ok(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
     "import");
  Ok(cuMemRelease(h), "cuMemRelease (exporter)");
  Check("exporter released, import held", limit);
  CUdeviceptr va = 0;
  Ok(cuMemAddressReserve(&va, 8 * kMiB, 0, 0, 0), "cuMemAddressReserve");
  Ok(cuMemMap(va, 8 * kMiB, 0, imported, 0), "cuMemMap");
  Ok(cuMemRelease(imported), "cuMemRelease (import)");
  Check("import mapped", limit);
  Ok(cuMemUnmap(va, 8 * kMiB), "cuMemUnmap");
  Check("import unmapped", limit);
  ::close(fd);
  std::printf("ok vmm-import\n");
}

// Issue 24 item 3: cuMemAllocAsync under stream capture, then launches of the graph.
void Graph(uint64_t limit) {
  Init();
  CUstream st = nullptr;
  Ok(cuStreamCreate(&st, 0), "cuStreamCreate");
  CUgraph g = nullptr;
  CUgraphExec exec = nullptr;
  CUdeviceptr p = 0;
  Ok(cuStreamBeginCapture_v2(st, 0), "cuStreamBeginCapture_v2");
  Ok(cuMemAllocAsync(&p, 16 * kMiB, st), "cuMemAllocAsync (captured)");
  Ok(cuStreamEndCapture(st, &g), "cuStreamEndCapture");
  Check("captured", limit);
  Ok(cuStreamSynchronize(st), "cuStreamSynchronize");
  Check("captured, synchronized", limit);
  Ok(cuGraphInstantiateWithFlags(&exec, g, 0), "cuGraphInstantiateWithFlags");
  int launches = 0;
  for (int i = 0; i < 4; ++i) {
    const CUresult rc = cuGraphLaunch(exec, st);
    Check("launched", limit);
    if (rc == CUDA_SUCCESS) {
      ++launches;
      Ok(cuMemFreeAsync(p, st), "cuMemFreeAsync (graph allocation)");
      Ok(cuStreamSynchronize(st), "cuStreamSynchronize");
      Check("graph allocation freed", limit);
    }
  }
  if (launches != 4) Fail("graph launches refused under the limit");
  Ok(cuGraphExecDestroy(exec), "cuGraphExecDestroy");
  Ok(cuGraphDestroy(g), "cuGraphDestroy");
  Ok(cuDeviceGraphMemTrim(0), "cuDeviceGraphMemTrim");
  Check("trimmed", limit);
  // A graph needing more than the limit leaves: its launch is refused before the driver runs it.
  CUDA_MEM_ALLOC_NODE_PARAMS params{};
  params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  params.poolProps.location.id = 0;
  params.bytesize = limit;
  CUgraphNode node = nullptr;
  Ok(cuGraphCreate(&g, 0), "cuGraphCreate");
  Ok(cuGraphAddMemAllocNode(&node, g, nullptr, 0, &params), "cuGraphAddMemAllocNode");
  Ok(cuGraphInstantiateWithFlags(&exec, g, 0), "cuGraphInstantiateWithFlags");
  if (cuGraphLaunch(exec, st) != CUDA_ERROR_OUT_OF_MEMORY) Fail("an oversized graph launched");
  Check("oversized graph refused", limit);
  std::printf("ok graph\n");
}

// Issue 24 item 4: a neighbour allocating while the library measures.
std::atomic<int> g_neighbour_once{0};
long long g_neighbour_bytes = 0;
const char* g_neighbour_event = "";
void NeighbourHook(const char* event, unsigned long long) {
  if (std::strcmp(event, g_neighbour_event) != 0 || g_neighbour_once.exchange(0) == 0) return;
  gpulet_sim_neighbour(0, g_neighbour_bytes);
}

void NeighbourModule(uint64_t limit) {
  Init();
  g_neighbour_event = "module_load";
  g_neighbour_bytes = 10LL << 30;
  g_neighbour_once = 1;
  gpulet_sim_set_hook(&NeighbourHook);
  static const unsigned char image[64] = {1};
  CUmodule m = nullptr;
  Ok(cuModuleLoadData(&m, image), "cuModuleLoadData");
  Check("module loaded while a neighbour took 10 GiB", limit);
  Ok(cuModuleUnload(m), "cuModuleUnload");
  Check("module unloaded", limit);
  std::printf("ok neighbour-module\n");
}

void NeighbourContext(uint64_t limit) {
  g_neighbour_event = "ctx_create";  // the library's throw-away context, measuring
  g_neighbour_bytes = 1LL << 30;
  g_neighbour_once = 1;
  gpulet_sim_set_hook(&NeighbourHook);
  Init();
  Check("context measured while a neighbour took 1 GiB", limit);
  std::printf("ok neighbour-context context_bytes=%" PRIu64 "\n", [] {
    Region r;
    r.Open(g_dir, true);
    return r.Usage().at(0).context_bytes;
  }());
}

// Issue 24 item 5: cuMemAllocAsync on a stream of device 1 while device 0 is current.
void StreamDevice(uint64_t limit) {
  Ok(cuInit(0), "cuInit");
  CUcontext c1 = nullptr;
  Ok(cuDevicePrimaryCtxRetain(&c1, 1), "retain 1");
  Ok(cuCtxSetCurrent(c1), "set 1");
  CUstream st1 = nullptr;
  Ok(cuStreamCreate(&st1, 0), "cuStreamCreate on 1");
  CUcontext c0 = nullptr;
  Ok(cuDevicePrimaryCtxRetain(&c0, 0), "retain 0");
  Ok(cuCtxSetCurrent(c0), "set 0");
  CUdeviceptr p = 0;
  Ok(cuMemAllocAsync(&p, 8 * kMiB, st1), "cuMemAllocAsync on device 1's stream");
  Check("device 0", limit, 0, 0);
  Check("device 1", limit, 1, 1);
  Ok(cuMemFreeAsync(p, st1), "cuMemFreeAsync");
  Ok(cuCtxSynchronize(), "cuCtxSynchronize");
  Check("device 1 after free", limit, 1, 1);
  std::printf("ok stream-device\n");
}

// Issue 24 item 5: array sizes are the driver's (formats the library's table misjudges, deferred
// mapping charged nothing).
void Arrays(uint64_t limit) {
  Init();
  const CUarray_format formats[] = {CU_AD_FORMAT_BC1_UNORM, CU_AD_FORMAT_BC7_UNORM,
                                    CU_AD_FORMAT_NV12, CU_AD_FORMAT_UNORM_INT8X4,
                                    CU_AD_FORMAT_FLOAT};
  for (CUarray_format f : formats) {
    CUDA_ARRAY3D_DESCRIPTOR d{1000, 600, 0, f, f == CU_AD_FORMAT_FLOAT ? 2u : 1u, 0};
    CUarray a = nullptr;
    Ok(cuArray3DCreate_v2(&a, &d), "cuArray3DCreate_v2");
    Check("array", limit);
    Ok(cuArrayDestroy(a), "cuArrayDestroy");
    d.Flags = CUDA_ARRAY3D_DEFERRED_MAPPING;
    Ok(cuArray3DCreate_v2(&a, &d), "cuArray3DCreate_v2 (deferred)");
    Check("deferred-mapping array", limit);
    Ok(cuArrayDestroy(a), "cuArrayDestroy");
  }
  CUDA_ARRAY3D_DESCRIPTOR m{512, 512, 0, CU_AD_FORMAT_BC3_UNORM, 1, 0};
  CUmipmappedArray mm = nullptr;
  Ok(cuMipmappedArrayCreate(&mm, &m, 6), "cuMipmappedArrayCreate");
  Check("mipmapped", limit);
  Ok(cuMipmappedArrayDestroy(mm), "cuMipmappedArrayDestroy");
  std::printf("ok arrays\n");
}

// Issue 24 item 5: a variant the library does not know is passed through untouched.
void ProcAddr(uint64_t) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  auto gpa = reinterpret_cast<decltype(&cuGetProcAddress_v2)>(dlsym(lib, "cuGetProcAddress_v2"));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st{};
  Ok(gpa("cuMemAllocManaged", &fn, 13000, 0, &st), "cuGetProcAddress_v2");
  Dl_info info{};
  dladdr(fn, &info);
  const std::string name = info.dli_sname != nullptr ? info.dli_sname : "?";
  const std::string file = info.dli_fname != nullptr ? info.dli_fname : "?";
  if (name != "cuMemAllocManaged_v2" || file.find("libcuda.so.1") == std::string::npos)
    Fail("cuMemAllocManaged at 13000 is " + file + ":" + name);
  std::printf("ok procaddr\n");
}

// A pool destroyed with blocks out is released when the last block is freed (cuMemPoolDestroy).
void PoolDestroyedWithBlocksOut(uint64_t limit) {
  Init();
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemoryPool pool = nullptr;
  Ok(cuMemPoolCreate(&pool, &props), "cuMemPoolCreate");
  CUdeviceptr p[3] = {};
  for (CUdeviceptr& x : p) Ok(cuMemAllocFromPoolAsync(&x, 8 * kMiB, pool, nullptr), "alloc");
  Ok(cuMemPoolDestroy(pool), "cuMemPoolDestroy");
  Check("pool destroyed, three blocks out", limit);
  for (CUdeviceptr x : p) {
    Ok(cuMemFreeAsync(x, nullptr), "cuMemFreeAsync");
    Check("a block of the destroyed pool freed", limit);
  }
  std::printf("ok pool-destroyed\n");
}

// Issue 24 item 6: eight threads retaining the primary context at once charge it once; twenty
// rounds, the context released in between, so a window between the driver's retain and the
// library's count is hit.
void RetainRace(uint64_t limit) {
  Ok(cuInit(0), "cuInit");
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> ready{0};
    std::vector<std::thread> ts;
    for (int i = 0; i < 8; ++i) {
      ts.emplace_back([&] {
        ready.fetch_add(1);
        while (ready.load() < 8) std::this_thread::yield();
        CUcontext c = nullptr;
        Ok(cuDevicePrimaryCtxRetain(&c, 0), "cuDevicePrimaryCtxRetain");
      });
    }
    for (auto& t : ts) t.join();
    Check("eight retains", limit);
    for (int i = 0; i < 8; ++i) Ok(cuDevicePrimaryCtxRelease_v2(0), "cuDevicePrimaryCtxRelease_v2");
    Check("eight releases", limit);
  }
  std::printf("ok retain-race\n");
}

// ---- the differential run ----------------------------------------------------------------------

struct Vmm {
  CUmemGenericAllocationHandle handle = 0;  // 0: released
  CUdeviceptr va = 0;
  uint64_t size = 0;
  bool mapped = false;
};

struct GraphRun {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  std::vector<CUdeviceptr> outside;  // allocations it leaves live, freed outside
};

void Differential(uint64_t limit, uint64_t seed, int64_t steps) {
  g_seed = seed;
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };
  CUcontext ctx = Init();
  CUstream st = nullptr;
  Ok(cuStreamCreate(&st, 0), "cuStreamCreate");
  CUmemoryPool pool = nullptr;
  Ok(cuDeviceGetDefaultMemPool(&pool, 0), "cuDeviceGetDefaultMemPool");
  Region region;
  if (!region.Open(g_dir).empty()) Fail("cannot open the region");
  std::vector<CUdeviceptr> ptrs, async_ptrs, graph_live, pool_ptrs;
  CUmemoryPool own_pool = nullptr;
  const bool trace = std::getenv("MODEL_TRACE") != nullptr;  // each step's operation, on stderr
  std::vector<Vmm> vmm;
  std::vector<CUarray> arrays;
  std::vector<CUmodule> modules;
  std::vector<GraphRun> graphs;
  static const unsigned char image[64] = {1};
  const uint64_t slack = 0;
  auto size = [&] { return 1 + pick(6 * kMiB); };
  auto remove_at = [](auto& v, size_t i) {
    auto x = v[i];
    v[i] = v.back();
    v.pop_back();
    return x;
  };
  for (g_step = 0; g_step < steps; ++g_step) {
    const uint64_t op = pick(110);
    if (trace) std::fprintf(stderr, "step %" PRId64 " op %" PRIu64 "\n", g_step, op);
    if (op >= 100) {
      if (op < 102) {
        // a second context, made and destroyed (the primary stays current)
        CUcontext c = nullptr;
        if (cuCtxCreate_v2(&c, 0, 0) == CUDA_SUCCESS) {
          Ok(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
          Check("context made", limit);
          Ok(cuCtxDestroy_v2(c), "cuCtxDestroy_v2");
          Ok(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
        }
      } else if (op < 106) {
        if (own_pool == nullptr) {
          CUmemPoolProps props{};
          props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
          props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
          Ok(cuMemPoolCreate(&own_pool, &props), "cuMemPoolCreate");
        }
        CUdeviceptr p = 0;
        if (cuMemAllocFromPoolAsync(&p, size(), own_pool, st) == CUDA_SUCCESS)
          pool_ptrs.push_back(p);
      } else if (op < 108) {
        if (!pool_ptrs.empty())
          Ok(cuMemFreeAsync(remove_at(pool_ptrs, pick(pool_ptrs.size())), st), "pool free");
      } else if (own_pool != nullptr) {
        // Blocks still out keep the pool's memory until the last is freed (cuMemPoolDestroy).
        Ok(cuMemPoolDestroy(own_pool), "cuMemPoolDestroy");
        own_pool = nullptr;
      }
      Check("differential", limit, 0, 0, slack);
      continue;
    }
    if (op < 14) {
      CUdeviceptr p = 0;
      if (cuMemAlloc_v2(&p, size()) == CUDA_SUCCESS) ptrs.push_back(p);
    } else if (op < 26) {
      if (!ptrs.empty()) Ok(cuMemFree_v2(remove_at(ptrs, pick(ptrs.size()))), "cuMemFree_v2");
    } else if (op < 36) {
      CUdeviceptr p = 0;
      if (cuMemAllocAsync(&p, size(), pick(2) ? st : nullptr) == CUDA_SUCCESS)
        async_ptrs.push_back(p);
    } else if (op < 45) {
      if (!async_ptrs.empty())
        Ok(cuMemFreeAsync(remove_at(async_ptrs, pick(async_ptrs.size())), st), "cuMemFreeAsync");
    } else if (op < 48) {
      Ok(pick(2) ? cuCtxSynchronize() : cuStreamSynchronize(st), "synchronize");
    } else if (op < 50) {
      Ok(cuMemPoolTrimTo(pool, pick(2) * 4 * kMiB), "cuMemPoolTrimTo");
    } else if (op < 56) {
      Vmm v;
      v.size = (1 + pick(4)) * 2 * kMiB;
      const CUmemAllocationProp prop = DeviceProp(0);
      if (cuMemCreate(&v.handle, v.size, &prop, 0) == CUDA_SUCCESS) {
        Ok(cuMemAddressReserve(&v.va, v.size, 0, 0, 0), "cuMemAddressReserve");
        if (pick(2)) {
          Ok(cuMemMap(v.va, v.size, 0, v.handle, 0), "cuMemMap");
          v.mapped = true;
        }
        vmm.push_back(v);
      }
    } else if (op < 62 && !vmm.empty()) {
      Vmm& v = vmm[pick(vmm.size())];
      const uint64_t what = pick(3);
      if (what == 0 && !v.mapped && v.handle != 0) {
        Ok(cuMemMap(v.va, v.size, 0, v.handle, 0), "cuMemMap");
        v.mapped = true;
      } else if (what == 1 && v.mapped) {
        Ok(cuMemUnmap(v.va, v.size), "cuMemUnmap");
        v.mapped = false;
      } else if (what == 2 && v.handle != 0) {
        Ok(cuMemRelease(v.handle), "cuMemRelease");
        v.handle = 0;
      } else if (v.mapped && v.handle == 0) {
        Ok(cuMemRetainAllocationHandle(&v.handle, reinterpret_cast<void*>(v.va)), "retain");
      }
      if (!v.mapped && v.handle == 0) {
        Ok(cuMemAddressFree(v.va, v.size), "cuMemAddressFree");
        v = vmm.back();
        vmm.pop_back();
      }
    } else if (op < 67) {
      static const CUarray_format fmts[] = {CU_AD_FORMAT_UNSIGNED_INT8, CU_AD_FORMAT_HALF,
                                            CU_AD_FORMAT_BC1_UNORM, CU_AD_FORMAT_NV12,
                                            CU_AD_FORMAT_SNORM_INT16X4};
      CUDA_ARRAY_DESCRIPTOR d{1 + pick(2048), pick(2) * pick(1024), fmts[pick(5)], 1u << pick(3)};
      CUarray a = nullptr;
      if (cuArrayCreate_v2(&a, &d) == CUDA_SUCCESS) arrays.push_back(a);
    } else if (op < 71) {
      if (!arrays.empty())
        Ok(cuArrayDestroy(remove_at(arrays, pick(arrays.size()))), "cuArrayDestroy");
    } else if (op < 74) {
      CUmodule m = nullptr;
      if (cuModuleLoadData(&m, image) == CUDA_SUCCESS) modules.push_back(m);
    } else if (op < 77) {
      if (!modules.empty())
        Ok(cuModuleUnload(remove_at(modules, pick(modules.size()))), "cuModuleUnload");
    } else if (op < 82) {
      // capture a graph with one or two allocations, one of them freed inside
      GraphRun g;
      Ok(cuStreamBeginCapture_v2(st, 0), "begin capture");
      CUdeviceptr a = 0, b = 0;
      Ok(cuMemAllocAsync(&a, size(), st), "captured alloc");
      const bool two = pick(2) != 0;
      if (two) {
        Ok(cuMemAllocAsync(&b, size(), st), "captured alloc");
        Ok(cuMemFreeAsync(b, st), "captured free");
      }
      Ok(cuStreamEndCapture(st, &g.graph), "end capture");
      Ok(cuGraphInstantiateWithFlags(&g.exec, g.graph, 0), "instantiate");
      g.outside.push_back(a);
      graphs.push_back(g);
    } else if (op < 88 && !graphs.empty()) {
      GraphRun& g = graphs[pick(graphs.size())];
      bool live = false;
      for (CUdeviceptr p : g.outside) {
        for (CUdeviceptr q : graph_live) live = live || p == q;
      }
      if (!live && cuGraphLaunch(g.exec, st) == CUDA_SUCCESS) {
        for (CUdeviceptr p : g.outside) graph_live.push_back(p);
      }
    } else if (op < 91) {
      if (!graph_live.empty()) {
        const CUdeviceptr p = remove_at(graph_live, pick(graph_live.size()));
        Ok(pick(2) ? cuMemFree_v2(p) : cuMemFreeAsync(p, st), "free a graph allocation");
      }
    } else if (op < 93) {
      Ok(cuDeviceGraphMemTrim(0), "cuDeviceGraphMemTrim");
    } else if (op < 95 && !graphs.empty()) {
      const size_t i = pick(graphs.size());
      Ok(cuGraphExecDestroy(graphs[i].exec), "cuGraphExecDestroy");
      Ok(cuGraphDestroy(graphs[i].graph), "cuGraphDestroy");
      graphs[i] = graphs.back();
      graphs.pop_back();
    } else if (op < 99 || pick(100) != 0) {
      // threads: alloc/free pairs on the same addresses at once
      std::vector<std::thread> ts;
      for (int t = 0; t < 3; ++t) {
        ts.emplace_back([&] {
          cuCtxSetCurrent(ctx);
          for (int i = 0; i < 16; ++i) {
            CUdeviceptr p = 0;
            if (cuMemAlloc_v2(&p, kMiB) == CUDA_SUCCESS) cuMemFree_v2(p);
          }
        });
      }
      for (auto& t : ts) t.join();
    } else {
      // fork: the child is a new process with its own CUDA; its charges are its own
      const uint64_t parent = Charged();
      const pid_t child = ::fork();
      if (child == 0) {
        CUcontext c = nullptr;
        if (cuInit(0) != CUDA_SUCCESS) std::_Exit(4);
        const CUresult rc = cuDevicePrimaryCtxRetain(&c, 0);
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) std::_Exit(Charged() == parent ? 0 : 5);
        if (rc != CUDA_SUCCESS || cuCtxSetCurrent(c) != CUDA_SUCCESS) std::_Exit(6);
        if (Charged() != parent + gpulet_sim_device_used(0)) std::_Exit(7);
        CUdeviceptr p = 0;
        if (cuMemAlloc_v2(&p, 4 * kMiB) == CUDA_SUCCESS &&
            Charged() != parent + gpulet_sim_device_used(0)) {
          std::_Exit(3);
        }
        std::_Exit(0);  // exits holding it: reaped
      }
      int status = 0;
      ::waitpid(child, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        Fail("forked child's charges (exit " + std::to_string(WEXITSTATUS(status)) + ")");
      region.Reap();
    }
    Check("differential", limit, 0, 0, slack);
  }
  std::printf("ok diff seed=%" PRIu64 " steps=%" PRId64 "\n", seed, steps);
}

// Issue 36 item 1: the driver's functions come from the driver, whoever asks first. Before any
// CUDA call the program resolves cuInit and cuMemAlloc_v2 with dlsym(RTLD_DEFAULT) (which finds
// the library's own exports first) and cuMemFree_v2 and cuCtxGetDevice from a tenant library's
// no-op copies (MODEL_POISON).
void DriverFirst(uint64_t limit) {
  const char* poison = std::getenv("MODEL_POISON");
  void* tenant = poison == nullptr ? nullptr : ::dlopen(poison, RTLD_NOW | RTLD_LOCAL);
  if (tenant == nullptr) Fail("cannot load MODEL_POISON");
  auto noop_free = reinterpret_cast<decltype(&cuMemFree_v2)>(::dlsym(tenant, "cuMemFree_v2"));
  auto lying_device =
      reinterpret_cast<decltype(&cuCtxGetDevice)>(::dlsym(tenant, "cuCtxGetDevice"));
  auto init = reinterpret_cast<decltype(&cuInit)>(::dlsym(RTLD_DEFAULT, "cuInit"));
  auto alloc = reinterpret_cast<decltype(&cuMemAlloc_v2)>(::dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
  if (noop_free == nullptr || lying_device == nullptr || init == nullptr || alloc == nullptr)
    Fail("dlsym");
  (void)lying_device;  // looked up only: the lookup itself must not reach the library's table
  Ok(init(0), "cuInit through dlsym(RTLD_DEFAULT)");  // d05f651: called itself until killed
  Init();
  Check("initialized", limit);
  for (int i = 0; i < 32; ++i) {
    CUdeviceptr p = 0;
    Ok(alloc(&p, 8 * kMiB), "cuMemAlloc_v2 through dlsym(RTLD_DEFAULT)");
    Check("allocated", limit);
    // Our dlsym hands out its wrapper for the name; the wrapper frees in the driver.
    Ok(noop_free(p), "cuMemFree_v2 looked up in the tenant's library");
    Check("freed", limit);
  }
  std::printf("ok driver-first\n");
}

// Issue 36 item 2: with no context current, a context-independent load (cuLibraryLoadData) is
// loaded into every live context (the model, [MOD]); the library charges or refuses, never passes
// it uncounted. Allocations without a context get the driver's own answer.
void LibraryNoContext(uint64_t limit) {
  Init();
  Check("initialized", limit);
  Ok(cuCtxSetCurrent(nullptr), "cuCtxSetCurrent(NULL)");
  unsigned char image[64] = {1};
  for (int i = 0; i < 8; ++i) {
    CUlibrary lib = nullptr;
    const CUresult rc = cuLibraryLoadData(&lib, image, nullptr, nullptr, 0, nullptr, nullptr, 0);
    Check("cuLibraryLoadData with no context current", limit);
    if (rc != CUDA_SUCCESS) break;
  }
  CUdeviceptr p = 0;
  const CUresult a = cuMemAlloc_v2(&p, kMiB);
  Check("cuMemAlloc_v2 with no context current", limit);
  const CUresult b = cuMemAllocAsync(&p, kMiB, nullptr);
  Check("cuMemAllocAsync with no context current", limit);
  if (a != CUDA_ERROR_INVALID_CONTEXT || b != CUDA_ERROR_INVALID_CONTEXT) {
    Fail("no context: cuMemAlloc_v2 rc=" + std::to_string(a) +
         " cuMemAllocAsync rc=" + std::to_string(b) + ", expected the driver's 201");
  }
  std::printf("ok library-no-context\n");
}

// Issue 36 item 6: memory exported as a POSIX descriptor lives until that descriptor is closed,
// after cuMemRelease and cuMemUnmap ([VMM] cuMemRelease, cuMemExportToShareableHandle).
void VmmExported(uint64_t limit) {
  Init();
  const uint64_t base = Charged();
  const CUmemAllocationProp prop = DeviceProp(0);
  CUmemGenericAllocationHandle h = 0;
  Ok(cuMemCreate(&h, 16 * kMiB, &prop, 0), "cuMemCreate");
  int fd = -1;
  Ok(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "export");
  CUdeviceptr va = 0;
  Ok(cuMemAddressReserve(&va, 16 * kMiB, 0, 0, 0), "cuMemAddressReserve");
  Ok(cuMemMap(va, 16 * kMiB, 0, h, 0), "cuMemMap");
  Ok(cuMemRelease(h), "cuMemRelease");
  Check("exported, released, mapped", limit);
  Ok(cuMemUnmap(va, 16 * kMiB), "cuMemUnmap");
  Check("exported, released, unmapped: the descriptor keeps it", limit);
  if (Charged() != base + 16 * kMiB || gpulet_sim_device_used(0) != base + 16 * kMiB)
    Fail("the exported memory was let go while its descriptor is open");
  ::close(fd);
  size_t free_b = 0, total_b = 0;
  Ok(cuMemGetInfo_v2(&free_b, &total_b), "cuMemGetInfo_v2");
  Check("descriptor closed", limit);
  if (Charged() != base) Fail("the exported memory is still charged after its descriptor closed");
  std::printf("ok vmm-exported\n");
}

// Issue 36 item 5: cuCtxSetLimit reserves device memory (the malloc heap, the stack for every
// resident thread): charged by what it took, refused (and undone) past the limit.
void ContextLimits(uint64_t limit) {
  Init();
  Check("initialized", limit);
  Ok(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 64 * kMiB), "cuCtxSetLimit(heap 64 MiB)");
  Check("heap 64 MiB", limit);
  const CUresult big = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024 + 4096);  // the model: 256 MiB
  Check("stack past the limit", limit);
  size_t stack = 0;
  Ok(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE), "cuCtxGetLimit");
  if (big != CUDA_ERROR_OUT_OF_MEMORY || stack != 1024)
    Fail("a stack past the limit: rc=" + std::to_string(big) + " stack=" + std::to_string(stack));
  Ok(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 * kMiB), "cuCtxSetLimit(heap back to 8 MiB)");
  Check("heap back to its default", limit);
  Ok(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 16 * kMiB), "cuCtxSetLimit(printf 16 MiB)");
  Check("printf FIFO 16 MiB", limit);
  Ok(cuDevicePrimaryCtxRelease_v2(0), "cuDevicePrimaryCtxRelease_v2");
  Check("context released", limit);
  std::printf("ok ctx-limits\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 3) {
    std::fprintf(stderr, "usage: memlimit_model DIR SCENARIO | DIR diff SEED STEPS\n");
    return 2;
  }
  g_dir = argv[1];
  const std::string what = argv[2];
  // The limit of GPUs 0 and 1, as the test wrote it into the limits file beside the library.
  const uint64_t limit =
      std::strtoull(std::getenv("MODEL_LIMIT") ? std::getenv("MODEL_LIMIT") : "0", nullptr, 10);
  if (limit == 0) Fail("MODEL_LIMIT not set");
  if (what == "reuse-race")
    ReuseRace(limit);
  else if (what == "vmm-mapped")
    VmmMapped(limit);
  else if (what == "vmm-retain")
    VmmRetain(limit);
  else if (what == "vmm-import")
    VmmImport(limit);
  else if (what == "graph")
    Graph(limit);
  else if (what == "neighbour-module")
    NeighbourModule(limit);
  else if (what == "neighbour-context")
    NeighbourContext(limit);
  else if (what == "stream-device")
    StreamDevice(limit);
  else if (what == "arrays")
    Arrays(limit);
  else if (what == "procaddr")
    ProcAddr(limit);
  else if (what == "retain-race")
    RetainRace(limit);
  else if (what == "pool-destroyed")
    PoolDestroyedWithBlocksOut(limit);
  else if (what == "driver-first")
    DriverFirst(limit);
  else if (what == "library-no-context")
    LibraryNoContext(limit);
  else if (what == "vmm-exported")
    VmmExported(limit);
  else if (what == "ctx-limits")
    ContextLimits(limit);
  else if (what == "diff" && argc == 5)
    Differential(limit, std::strtoull(argv[3], nullptr, 10), std::strtoll(argv[4], nullptr, 10));
  else
    Fail("unknown scenario " + what);
  return 0;
}
