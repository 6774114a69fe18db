// A CUDA program for the memory-limit tests: linked against libcuda.so.1 (the simulated one in
// tests; nvcc builds the same file against the real driver in
// scripts/device-check-memory-limits.sh) and reaching the driver one of three ways:
//   --via link      the symbols the dynamic linker bound (direct linking)
//   --via dlsym     dlopen("libcuda.so.1") + dlsym("cu…_v2")
//   --via procaddr  as the CUDA 13 runtime: dlsym only cuGetProcAddress_v2, ask it for itself,
//                   then resolve every entry point by base name with cudaVersion 13000
// Commands run in order and print one "key=value …" line each:
//   init                        cuInit, retain + set the primary context of --device
//   fill API CHUNK              allocate CHUNK bytes through API until it fails
//   alloc API SIZE              one allocation (kept)
//   freeall                     release everything kept, through the matching release call
//   sync                        cuCtxSynchronize
//   trim                        cuMemPoolTrimTo(pool of the last pool allocation, 0)
//   info                        cuMemGetInfo, cuDeviceTotalMem, nvmlDeviceGetMemoryInfo(_v2)
//   race THREADS API CHUNK      THREADS threads fill at once; the total admitted
//   owners                      library:symbol of each resolved entry point
//   ptsz                        (procaddr) cuMemAllocAsync with per-thread default stream
//   exporttable                 cuGetExportTable through the resolved pointer
//   rtldnext                    dlsym(RTLD_NEXT, "cuMemAlloc_v2")
//   rtlddefault SIZE            cuInit and cuMemAlloc_v2 looked up with dlsym(RTLD_DEFAULT), called
//   inherit                     clear FD_CLOEXEC on every /dev/nvidia* descriptor (before exec)
//   drivers                     each loaded libcuda.so.1 (path) and what it holds on device 0
//                               (the simulated driver's gpulet_sim_device_used)
//   wait FILE                   until FILE exists (several processes start together)
//   hold                        print "holding" and wait to be killed
//   exec                        exec this program with the commands after it (same pid)
// APIs: alloc pitch managed create async pool array array3d mipmap module library context
//       modulefile fatbinary libraryfile green
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cudashim/cuda_api.h"
#include "gpu/nvml_api.h"

namespace {

struct Api {
#define PROBE_FIELD(name, base, since, ptsz, ret, params) decltype(&::name) name = nullptr;
  GPULET_CUDA_WRAPPED(PROBE_FIELD)
  GPULET_CUDA_PLAIN(PROBE_FIELD)
#undef PROBE_FIELD
};

Api g_api;
decltype(&::cuGetProcAddress_v2) g_gpa = nullptr;
std::string g_via = "link";
int g_device = 0;

bool Resolve() {
  if (g_via == "link") {
#define PROBE_LINK(name, base, since, ptsz, ret, params) g_api.name = &::name;
    GPULET_CUDA_WRAPPED(PROBE_LINK)
    GPULET_CUDA_PLAIN(PROBE_LINK)
#undef PROBE_LINK
    return true;
  }
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("error=dlopen %s\n", dlerror());
    return false;
  }
  if (g_via == "dlsym") {
#define PROBE_DLSYM(name, base, since, ptsz, ret, params) \
  g_api.name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name));
    GPULET_CUDA_WRAPPED(PROBE_DLSYM)
    GPULET_CUDA_PLAIN(PROBE_DLSYM)
#undef PROBE_DLSYM
    return true;
  }
  // The CUDA 13 runtime: one dlsym, then cuGetProcAddress_v2 for itself and everything else.
  auto first =
      reinterpret_cast<decltype(&::cuGetProcAddress_v2)>(dlsym(lib, "cuGetProcAddress_v2"));
  if (first == nullptr) return false;
  void* p = nullptr;
  CUdriverProcAddressQueryResult st{};
  if (first("cuGetProcAddress", &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS)
    return false;
  auto gpa = reinterpret_cast<decltype(&::cuGetProcAddress_v2)>(p);
  g_gpa = gpa;
  const cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT;
  // Each variant is asked for by its base name: with cudaVersion 13000 when it is the newest of
  // its base (what the CUDA 13 runtime gets), else with the version that introduced it (what an
  // older runtime gets), so every field holds a function of the type it is called with.
  struct Want {
    const char* base;
    int since;
    bool ptsz;
    void** field;
  };
  const Want wants[] = {
#define PROBE_WANT(name, base, since, ptsz, ret, params) \
  {#base, since, ptsz != 0, reinterpret_cast<void**>(&g_api.name)},
      GPULET_CUDA_WRAPPED(PROBE_WANT) GPULET_CUDA_PLAIN(PROBE_WANT)
#undef PROBE_WANT
  };
  int resolved = 0;
  for (const Want& w : wants) {
    if (w.ptsz) continue;  // the `ptsz` command asks for those
    int newest = 0;
    for (const Want& o : wants) {
      if (std::strcmp(o.base, w.base) == 0 && o.ptsz == w.ptsz) newest = std::max(newest, o.since);
    }
    const int version = w.since == newest ? 13000 : w.since;
    if (gpa(w.base, w.field, version, flags, &st) == CUDA_SUCCESS) ++resolved;
  }
  std::printf("procaddr resolved=%d\n", resolved);
  return true;
}

// "library:symbol" of a function pointer.
std::string Owner(void* fn) {
  Dl_info info{};
  if (fn == nullptr) return "none";
  if (dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  const char* slash = std::strrchr(info.dli_fname, '/');
  return std::string(slash != nullptr ? slash + 1 : info.dli_fname) + ":" +
         (info.dli_sname != nullptr ? info.dli_sname : "?");
}

// One kept allocation and how to give it back.
struct Held {
  std::string api;
  CUdeviceptr ptr = 0;
  CUmemGenericAllocationHandle handle = 0;
  void* object = nullptr;
  CUmemoryPool pool = nullptr;
};

std::mutex g_mu;
std::vector<Held> g_held;
CUmemoryPool g_pool = nullptr;
CUcontext g_primary = nullptr;
unsigned char g_image[64] = {1};

CUresult AllocOnce(const std::string& api, size_t size, Held* out) {
  out->api = api;
  if (api == "alloc") return g_api.cuMemAlloc_v2(&out->ptr, size);
  if (api == "pitch") {
    size_t pitch = 0;
    return g_api.cuMemAllocPitch_v2(&out->ptr, &pitch, size / 16, 16, 4);
  }
  if (api == "managed") return g_api.cuMemAllocManaged(&out->ptr, size, CU_MEM_ATTACH_GLOBAL);
  if (api == "create") {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = g_device;
    return g_api.cuMemCreate(&out->handle, size, &prop, 0);
  }
  if (api == "async") return g_api.cuMemAllocAsync(&out->ptr, size, nullptr);
  if (api == "pool") {
    {
      std::lock_guard lock(g_mu);
      if (g_pool == nullptr) {
        CUmemPoolProps props{};
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = g_device;
        if (CUresult rc = g_api.cuMemPoolCreate(&g_pool, &props); rc != CUDA_SUCCESS) return rc;
      }
      out->pool = g_pool;
    }
    return g_api.cuMemAllocFromPoolAsync(&out->ptr, size, out->pool, nullptr);
  }
  if (api == "array") {
    CUDA_ARRAY_DESCRIPTOR d{size, 1, CU_AD_FORMAT_UNSIGNED_INT8, 1};
    return g_api.cuArrayCreate_v2(reinterpret_cast<CUarray*>(&out->object), &d);
  }
  if (api == "array3d") {
    CUDA_ARRAY3D_DESCRIPTOR d{size / 64, 8, 8, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    return g_api.cuArray3DCreate_v2(reinterpret_cast<CUarray*>(&out->object), &d);
  }
  if (api == "mipmap") {
    CUDA_ARRAY3D_DESCRIPTOR d{size / 4, 1, 0, CU_AD_FORMAT_FLOAT, 1, 0};
    return g_api.cuMipmappedArrayCreate(reinterpret_cast<CUmipmappedArray*>(&out->object), &d, 1);
  }
  if (api == "module")
    return g_api.cuModuleLoadData(reinterpret_cast<CUmodule*>(&out->object), g_image);
  if (api == "library") {
    return g_api.cuLibraryLoadData(reinterpret_cast<CUlibrary*>(&out->object), g_image, nullptr,
                                   nullptr, 0, nullptr, nullptr, 0);
  }
  if (api == "modulefile")
    return g_api.cuModuleLoad(reinterpret_cast<CUmodule*>(&out->object), "probe.cubin");
  if (api == "fatbinary")
    return g_api.cuModuleLoadFatBinary(reinterpret_cast<CUmodule*>(&out->object), g_image);
  if (api == "libraryfile") {
    return g_api.cuLibraryLoadFromFile(reinterpret_cast<CUlibrary*>(&out->object), "probe.cubin",
                                       nullptr, nullptr, 0, nullptr, nullptr, 0);
  }
  if (api == "green") {
    // (A real program passes a descriptor from cuDevResourceGenerateDesc; the model takes any.)
    static unsigned char desc_storage[16];
    return g_api.cuGreenCtxCreate(reinterpret_cast<CUgreenCtx*>(&out->object),
                                  reinterpret_cast<CUdevResourceDesc>(desc_storage), g_device, 0);
  }
  if (api == "context") {
    CUresult rc = g_api.cuCtxCreate_v2(reinterpret_cast<CUcontext*>(&out->object), 0, g_device);
    if (rc == CUDA_SUCCESS) g_api.cuCtxSetCurrent(g_primary);  // keep allocating in the primary
    return rc;
  }
  std::printf("error=unknown api %s\n", api.c_str());
  std::exit(2);
}

CUresult Release(const Held& h) {
  if (h.api == "create") return g_api.cuMemRelease(h.handle);
  if (h.api == "async" || h.api == "pool") return g_api.cuMemFreeAsync(h.ptr, nullptr);
  if (h.api == "array" || h.api == "array3d")
    return g_api.cuArrayDestroy(static_cast<CUarray>(h.object));
  if (h.api == "mipmap")
    return g_api.cuMipmappedArrayDestroy(static_cast<CUmipmappedArray>(h.object));
  if (h.api == "module" || h.api == "modulefile" || h.api == "fatbinary")
    return g_api.cuModuleUnload(static_cast<CUmodule>(h.object));
  if (h.api == "library" || h.api == "libraryfile")
    return g_api.cuLibraryUnload(static_cast<CUlibrary>(h.object));
  if (h.api == "green") return g_api.cuGreenCtxDestroy(static_cast<CUgreenCtx>(h.object));
  if (h.api == "context") return g_api.cuCtxDestroy_v2(static_cast<CUcontext>(h.object));
  return g_api.cuMemFree_v2(h.ptr);
}

// Allocates until the first failure; returns the number of successes and the failing code.
uint64_t Fill(const std::string& api, size_t chunk, CUresult* last) {
  uint64_t count = 0;
  for (;;) {
    Held h;
    const CUresult rc = AllocOnce(api, chunk, &h);
    if (rc != CUDA_SUCCESS) {
      *last = rc;
      return count;
    }
    std::lock_guard lock(g_mu);
    g_held.push_back(h);
    ++count;
  }
}

void Info() {
  size_t cu_free = 0, cu_total = 0, total_mem = 0;
  const CUresult a = g_api.cuMemGetInfo_v2(&cu_free, &cu_total);
  const CUresult b = g_api.cuDeviceTotalMem_v2(&total_mem, g_device);
  std::printf("info cu_rc=%d cu_free=%zu cu_total=%zu total_mem_rc=%d total_mem=%zu", a, cu_free,
              cu_total, b, total_mem);
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml != nullptr) {
    auto init = reinterpret_cast<nvmlReturn_t (*)()>(dlsym(nvml, "nvmlInit_v2"));
    auto by_index = reinterpret_cast<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(
        dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2"));
    auto v1 = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*)>(
        dlsym(nvml, "nvmlDeviceGetMemoryInfo"));
    auto v2 = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t*)>(
        dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2"));
    nvmlDevice_t dev = nullptr;
    nvmlMemory_t m1{};
    nvmlMemory_v2_t m2{};
    m2.version = nvmlMemory_v2;
    if (init != nullptr && init() == NVML_SUCCESS && by_index(g_device, &dev) == NVML_SUCCESS &&
        v1(dev, &m1) == NVML_SUCCESS && v2(dev, &m2) == NVML_SUCCESS) {
      std::printf(
          " nvml_total=%llu nvml_free=%llu nvml_used=%llu nvml2_total=%llu nvml2_free=%llu "
          "nvml2_used=%llu nvml2_reserved=%llu",
          m1.total, m1.free, m1.used, m2.total, m2.free, m2.used, m2.reserved);
    }
  }
  std::printf("\n");
}

size_t Number(const char* s) { return std::strtoull(s, nullptr, 0); }

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int i = 1;
  for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
    if (std::strcmp(argv[i], "--via") == 0) g_via = argv[i + 1];
    if (std::strcmp(argv[i], "--device") == 0) g_device = std::atoi(argv[i + 1]);
  }
  if (!Resolve()) return 1;
  for (; i < argc; ++i) {
    const std::string cmd = argv[i];
    if (cmd == "init") {
      CUresult rc = g_api.cuInit(0);
      if (rc == CUDA_SUCCESS) rc = g_api.cuDevicePrimaryCtxRetain(&g_primary, g_device);
      if (rc == CUDA_SUCCESS) rc = g_api.cuCtxSetCurrent(g_primary);
      std::printf("init rc=%d\n", rc);
    } else if (cmd == "fill" && i + 2 < argc) {
      const std::string api = argv[++i];
      const size_t chunk = Number(argv[++i]);
      CUresult last = CUDA_SUCCESS;
      const uint64_t n = Fill(api, chunk, &last);
      std::printf("fill api=%s count=%llu admitted=%llu last_rc=%d\n", api.c_str(),
                  static_cast<unsigned long long>(n), static_cast<unsigned long long>(n * chunk),
                  last);
    } else if (cmd == "alloc" && i + 2 < argc) {
      Held h;
      const std::string api = argv[++i];
      const CUresult rc = AllocOnce(api, Number(argv[++i]), &h);
      if (rc == CUDA_SUCCESS) g_held.push_back(h);
      std::printf("alloc api=%s rc=%d\n", api.c_str(), rc);
    } else if (cmd == "freeall") {
      int failures = 0;
      for (auto it = g_held.rbegin(); it != g_held.rend(); ++it)
        failures += Release(*it) != CUDA_SUCCESS;
      g_held.clear();
      std::printf("freeall failures=%d\n", failures);
    } else if (cmd == "sync") {
      std::printf("sync rc=%d\n", g_api.cuCtxSynchronize());
    } else if (cmd == "trim") {
      std::printf("trim rc=%d\n", g_pool == nullptr ? -1 : g_api.cuMemPoolTrimTo(g_pool, 0));
    } else if (cmd == "info") {
      Info();
    } else if (cmd == "race" && i + 3 < argc) {
      const int threads = std::atoi(argv[++i]);
      const std::string api = argv[++i];
      const size_t chunk = Number(argv[++i]);
      std::atomic<uint64_t> total{0};
      std::atomic<int> ready{0};
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&] {
          // Each thread works in the primary context, as the runtime's threads do.
          g_api.cuCtxSetCurrent(g_primary);
          ready.fetch_add(1);
          while (ready.load() < threads) std::this_thread::yield();
          CUresult last = CUDA_SUCCESS;
          total.fetch_add(Fill(api, chunk, &last) * chunk);
        });
      }
      for (auto& t : pool) t.join();
      std::printf("race admitted=%llu\n", static_cast<unsigned long long>(total.load()));
    } else if (cmd == "owners") {
      std::printf("owners");
#define PROBE_OWNER(name, base, since, ptsz, ret, params)                             \
  if (g_api.name != nullptr) {                                                        \
    std::printf(" %s=%s", #name, Owner(reinterpret_cast<void*>(g_api.name)).c_str()); \
  }
      GPULET_CUDA_WRAPPED(PROBE_OWNER)
      GPULET_CUDA_PLAIN(PROBE_OWNER)
#undef PROBE_OWNER
      std::printf("\n");
    } else if (cmd == "ptsz") {
      // Per-thread default stream: the runtime built with --default-stream per-thread asks so.
      // (The CUDA 13 runtime asks for both tables at start, whatever it was built with.)
      CUresult rc = CUDA_SUCCESS;
      std::printf("ptsz");
      for (const char* base : {"cuMemAllocAsync", "cuGraphUpload", "cuGraphInstantiateWithParams"}) {
        void* fn = nullptr;
        CUdriverProcAddressQueryResult st{};
        const CUresult r = g_gpa == nullptr
                               ? CUDA_ERROR_NOT_FOUND
                               : g_gpa(base, &fn, 13000,
                                       CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
        if (r != CUDA_SUCCESS) rc = r;
        std::printf(" %s=%s", base, Owner(fn).c_str());
      }
      std::printf(" rc=%d\n", rc);
    } else if (cmd == "rtldnext") {
      // From the program, the next cuMemAlloc_v2 after it is the preloaded library's.
      std::printf("rtldnext cuMemAlloc_v2=%s\n", Owner(dlsym(RTLD_NEXT, "cuMemAlloc_v2")).c_str());
    } else if (cmd == "rtlddefault" && i + 1 < argc) {
      // An honest program that finds the driver's functions in the global scope (issue 36 item 1).
      auto init = reinterpret_cast<decltype(&::cuInit)>(dlsym(RTLD_DEFAULT, "cuInit"));
      auto alloc =
          reinterpret_cast<decltype(&::cuMemAlloc_v2)>(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
      CUresult a = init == nullptr ? CUDA_ERROR_NOT_FOUND : init(0);
      CUdeviceptr p = 0;
      CUresult b = alloc == nullptr ? CUDA_ERROR_NOT_FOUND : alloc(&p, Number(argv[++i]));
      if (b == CUDA_SUCCESS) g_held.push_back(Held{"alloc", p});
      std::printf("rtlddefault init_rc=%d alloc_rc=%d\n", a, b);
    } else if (cmd == "inherit") {
      // The driver's descriptors made to survive exec (issue 36 item 7).
      int kept = 0;
      if (DIR* dir = opendir("/proc/self/fd")) {
        while (const dirent* e = readdir(dir)) {
          char target[256];
          const ssize_t n = readlinkat(dirfd(dir), e->d_name, target, sizeof target - 1);
          if (n <= 0) continue;
          target[n] = '\0';
          if (std::strncmp(target, "/dev/nvidia", 11) != 0) continue;
          const int fd = std::atoi(e->d_name);
          kept += fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) & ~FD_CLOEXEC) == 0;
        }
        closedir(dir);
      }
      std::printf("inherit kept=%d\n", kept);
    } else if (cmd == "drivers") {
      std::vector<std::string> paths;
      dl_iterate_phdr(
          [](dl_phdr_info* info, size_t, void* out) {
            const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
            if (name.size() >= 12 && name.compare(name.size() - 12, 12, "libcuda.so.1") == 0)
              static_cast<std::vector<std::string>*>(out)->push_back(name);
            return 0;
          },
          &paths);
      std::printf("drivers");
      for (const std::string& p : paths) {
        void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_NOLOAD);
        auto used = h == nullptr ? nullptr
                                 : reinterpret_cast<unsigned long long (*)(int)>(
                                       dlsym(h, "gpulet_sim_device_used"));
        const long long held = used == nullptr ? -1LL : static_cast<long long>(used(0));
        std::printf(" %s=%lld", p.c_str(), held);
      }
      std::printf("\n");
    } else if (cmd == "exporttable") {
      const void* table = nullptr;
      CUuuid id{};
      const CUresult rc = g_api.cuGetExportTable(&table, &id);
      const bool driver =
          rc == CUDA_SUCCESS && table != nullptr && std::memcmp(table, "gpulet-sim-etbl", 16) == 0;
      std::printf("exporttable rc=%d driver_table=%d\n", rc, driver ? 1 : 0);
    } else if (cmd == "wait" && i + 1 < argc) {
      // A start line for several processes: wait until the file exists.
      const char* go = argv[++i];
      while (access(go, F_OK) != 0) usleep(1000);
    } else if (cmd == "exec") {
      // A new image of the same process: its CUDA state (and memory) is gone, pid and start time
      // are the same.
      std::vector<char*> next = {argv[0]};
      if (g_via != "link") {
        next.push_back(const_cast<char*>("--via"));
        next.push_back(const_cast<char*>(g_via.c_str()));
      }
      for (int j = i + 1; j < argc; ++j) next.push_back(argv[j]);
      next.push_back(nullptr);
      std::fflush(stdout);
      execv("/proc/self/exe", next.data());
      std::printf("error=exec failed\n");
      return 1;
    } else if (cmd == "hold") {
      std::printf("holding\n");
      for (;;) pause();
    } else {
      std::printf("error=unknown command %s\n", cmd.c_str());
      return 2;
    }
  }
  return 0;
}
