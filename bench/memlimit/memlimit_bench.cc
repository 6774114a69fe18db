// Cost of libgpulet-cuda.so on the paths it wraps, against the simulated libcuda.so.1: the same
// binary runs once without the library and once under LD_PRELOAD (bench/memlimit/run.sh), and
// the difference is the library's. Prints one line per operation: "name median_ns p99_ns", each
// the per-call time of a batch, over many batches.
//
//   memlimit_bench --make-region DIR [LIMIT]  write DIR/memory.region and DIR/gpulet-cuda.limits
//                                       for devices 0 and 1 (LIMIT bytes each, default 64 GiB);
//                                       run.sh copies the library into DIR, beside the limits file
//   memlimit_bench [BATCHES]            time the operations
#include <dlfcn.h>
#include <limits.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cudashim/cuda_api.h"
#include "cudashim/region.h"

namespace {

constexpr int kPerBatch = 2000;

template <typename Op>
void Time(const char* name, int batches, Op&& op) {
  std::vector<double> per_call;
  for (int b = 0; b < batches; ++b) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kPerBatch; ++i) op();
    const auto end = std::chrono::steady_clock::now();
    per_call.push_back(std::chrono::duration<double, std::nano>(end - start).count() / kPerBatch);
  }
  std::sort(per_call.begin(), per_call.end());
  const double median = per_call[per_call.size() / 2];
  const double p99 = per_call[std::min(per_call.size() - 1, per_call.size() * 99 / 100)];
  std::printf("%s %.1f %.1f\n", name, median, p99);
}

void Check(CUresult rc, const char* what) {
  if (rc != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: CUresult %d\n", what, rc);
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Check(cuInit(0), "cuInit");
  if ((argc == 3 || argc == 4) && std::strcmp(argv[1], "--make-region") == 0) {
    const uint64_t limit = argc == 4 ? std::strtoull(argv[3], nullptr, 10) : 64ULL << 30;
    std::vector<gpulet::cudashim::GpuLimit> gpus;
    for (int dev = 0; dev < 2; ++dev) {
      CUuuid u{};
      Check(cuDeviceGetUuid(&u, dev), "cuDeviceGetUuid");
      gpus.push_back({gpulet::cudashim::GpuUuidString(u), limit, 0});
    }
    std::string err = gpulet::cudashim::CreateRegion(argv[2], gpus, /*replace=*/true);
    if (err.empty()) {
      // The driver the library calls: the one this program was linked against, by its path.
      Dl_info info{};
      char driver[PATH_MAX] = {};
      if (::dladdr(reinterpret_cast<void*>(&cuInit), &info) == 0 || info.dli_fname == nullptr ||
          ::realpath(info.dli_fname, driver) == nullptr) {
        std::fprintf(stderr, "cannot tell the driver's path\n");
        return 1;
      }
      err = gpulet::cudashim::WriteLimitsFile(
          std::string(argv[2]) + "/" + gpulet::cudashim::kLimitsFileName, gpus, false, driver);
    }
    if (!err.empty()) std::fprintf(stderr, "%s\n", err.c_str());
    return err.empty() ? 0 : 1;
  }
  const int batches = argc > 1 ? std::atoi(argv[1]) : 500;
  CUcontext ctx = nullptr;
  Check(cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
  Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");

  Time("alloc_free_pair", batches, [] {
    CUdeviceptr p = 0;
    Check(cuMemAlloc_v2(&p, 1 << 20), "cuMemAlloc_v2");
    Check(cuMemFree_v2(p), "cuMemFree_v2");
  });
  Time("async_alloc_free_pair", batches, [] {
    CUdeviceptr p = 0;
    Check(cuMemAllocAsync(&p, 1 << 20, nullptr), "cuMemAllocAsync");
    Check(cuMemFreeAsync(p, nullptr), "cuMemFreeAsync");
  });
  Time("getprocaddress_wrapped", batches, [] {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st{};
    Check(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, &st), "cuGetProcAddress_v2");
  });
  Time("getprocaddress_passthrough", batches, [] {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st{};
    Check(cuGetProcAddress_v2("cuLaunchKernel", &fn, 13000, 0, &st), "cuGetProcAddress_v2");
  });
  static int kernel = 0;
  Time("launch_kernel", batches, [] {
    Check(cuLaunchKernel(&kernel, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr),
          "cuLaunchKernel");
  });
  return 0;
}
