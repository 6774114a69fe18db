// The CUDA runtime under libgpulet-cuda.so on a real GPU (scripts/device-check-memory-limits.sh).
// The runtime reaches the driver only through cuGetProcAddress, so every line below also checks
// that path. One command per run; each prints "key=value …":
//   malloc CHUNK   cudaMalloc until it fails
//   async CHUNK    cudaMallocAsync (+ stream synchronize) until it fails
//   vmm CHUNK      cuMemCreate on the device until it fails (CHUNK rounded to the granularity)
//   array CHUNK    cudaMallocArray (float, about CHUNK bytes each) until it fails; each array's
//                  size is the driver's (the same array made with cudaArrayDeferredMapping, then
//                  cudaArrayGetMemoryRequirements), not computed here
//   vmm-mapped CHUNK  cuMemCreate, map, release (NVIDIA's vectorAddMMAP pattern) until it fails:
//                  the mapped memory stays alive and must stay charged
//   graph CHUNK    a captured graph of cudaMallocAsync nodes: one within the limit (launched 3
//                  times, freed in between) and one past it (its launch must fail)
//   reuse CHUNK    4 threads cudaMalloc/cudaFree CHUNK 2,000 times each at once; then the free
//                  memory cudaMemGetInfo reports must be what it was before (no charge lost)
//   info           cudaMemGetInfo and a kernel launch
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

__global__ void Touch(int* p) { p[threadIdx.x] = threadIdx.x; }

// Pinned device memory on GPU 0, and its allocation granularity.
CUmemAllocationProp DeviceProp(size_t* granularity) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  *granularity = 0;
  cuMemGetAllocationGranularity(granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  return prop;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const char* cmd = argv[1];
  const size_t chunk = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : (64u << 20);
  cudaError_t e = cudaSetDevice(0);
  if (e == cudaSuccess) e = cudaFree(nullptr);  // creates the primary context (charged)
  std::printf("context err=%s\n", cudaGetErrorName(e));
  if (e != cudaSuccess) return 0;
  size_t admitted = 0;
  if (std::strcmp(cmd, "malloc") == 0) {
    void* p = nullptr;
    while ((e = cudaMalloc(&p, chunk)) == cudaSuccess) admitted += chunk;
  } else if (std::strcmp(cmd, "async") == 0) {
    cudaStream_t s;
    cudaStreamCreate(&s);
    void* p = nullptr;
    while ((e = cudaMallocAsync(&p, chunk, s)) == cudaSuccess) admitted += chunk;
    cudaStreamSynchronize(s);
  } else if (std::strcmp(cmd, "vmm") == 0) {
    size_t gran = 0;
    const CUmemAllocationProp prop = DeviceProp(&gran);
    const size_t size = (chunk + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h;
    CUresult r;
    while ((r = cuMemCreate(&h, size, &prop, 0)) == CUDA_SUCCESS) admitted += size;
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    std::printf("vmm admitted=%zu err=%s\n", admitted, name);
    return 0;
  } else if (std::strcmp(cmd, "array") == 0) {
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
    cudaArray_t a;
    const size_t width = 16384, height = chunk / (width * sizeof(float));
    // The driver's size of one such array: asked of a deferred-mapping twin (no memory).
    size_t each = 0;
    cudaArray_t twin;
    if (cudaMallocArray(&twin, &desc, width, height, cudaArrayDeferredMapping) == cudaSuccess) {
      cudaArrayMemoryRequirements req = {};
      if (cudaArrayGetMemoryRequirements(&req, twin, 0) == cudaSuccess) each = req.size;
      cudaFreeArray(twin);
    }
    std::printf("array driver_size=%zu\n", each);
    if (each == 0) return 0;
    while ((e = cudaMallocArray(&a, &desc, width, height)) == cudaSuccess) admitted += each;
  } else if (std::strcmp(cmd, "vmm-mapped") == 0) {
    size_t gran = 0;
    const CUmemAllocationProp prop = DeviceProp(&gran);
    const size_t size = (chunk + gran - 1) / gran * gran;
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    std::vector<CUdeviceptr> ranges;
    CUresult r = CUDA_SUCCESS;
    for (;;) {
      CUmemGenericAllocationHandle h;
      if ((r = cuMemCreate(&h, size, &prop, 0)) != CUDA_SUCCESS) break;
      CUdeviceptr va = 0;
      cuMemAddressReserve(&va, size, gran, 0, 0);
      cuMemMap(va, size, 0, h, 0);
      cuMemSetAccess(va, size, &access, 1);
      cuMemRelease(h);  // the mapping keeps the memory
      ranges.push_back(va);
      admitted += size;
    }
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    std::printf("vmm-mapped admitted=%zu err=%s free=%zu\n", admitted, name, free_b);
    for (CUdeviceptr va : ranges) {
      cuMemUnmap(va, size);
      cuMemAddressFree(va, size);
    }
    size_t free_after = 0;
    cudaMemGetInfo(&free_after, &total_b);
    std::printf("vmm-mapped unmapped_free=%zu\n", free_after);
    return 0;
  } else if (std::strcmp(cmd, "graph") == 0) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaStream_t s;
    cudaStreamCreate(&s);
    auto capture = [&](size_t nodes, cudaGraphExec_t* exec, std::vector<void*>* ptrs) {
      cudaGraph_t g;
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      for (size_t i = 0; i < nodes; ++i) {
        void* p = nullptr;
        cudaMallocAsync(&p, chunk, s);
        ptrs->push_back(p);
      }
      cudaStreamEndCapture(s, &g);
      return cudaGraphInstantiate(exec, g, 0);
    };
    cudaGraphExec_t small, big;
    std::vector<void*> small_ptrs, big_ptrs;
    capture(2, &small, &small_ptrs);
    cudaError_t small_err = cudaSuccess;
    for (int i = 0; i < 3 && small_err == cudaSuccess; ++i) {
      small_err = cudaGraphLaunch(small, s);
      if (small_err == cudaSuccess) small_err = cudaStreamSynchronize(s);
      for (void* p : small_ptrs) cudaFreeAsync(p, s);
      cudaStreamSynchronize(s);
    }
    capture(total_b / chunk + 2, &big, &big_ptrs);
    cudaError_t big_err = cudaGraphLaunch(big, s);
    if (big_err == cudaSuccess) big_err = cudaStreamSynchronize(s);
    std::printf("graph small=%s big=%s\n", cudaGetErrorName(small_err), cudaGetErrorName(big_err));
    return 0;
  } else if (std::strcmp(cmd, "reuse") == 0) {
    size_t before = 0, after = 0, total_b = 0;
    cudaMemGetInfo(&before, &total_b);
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([chunk] {
        cudaSetDevice(0);
        for (int i = 0; i < 2000; ++i) {
          void* p = nullptr;
          if (cudaMalloc(&p, chunk) == cudaSuccess) cudaFree(p);
        }
      });
    }
    for (auto& t : ts) t.join();
    cudaMemGetInfo(&after, &total_b);
    std::printf("reuse before=%zu after=%zu\n", before, after);
    return 0;
  } else if (std::strcmp(cmd, "info") == 0) {
    size_t free_b = 0, total_b = 0;
    e = cudaMemGetInfo(&free_b, &total_b);
    int* d = nullptr;
    cudaMalloc(&d, 1024);
    Touch<<<1, 32>>>(d);
    const cudaError_t k = cudaDeviceSynchronize();
    std::printf("info err=%s free=%zu total=%zu kernel=%s\n", cudaGetErrorName(e), free_b, total_b,
                cudaGetErrorName(k));
    return 0;
  } else {
    return 2;
  }
  std::printf("%s admitted=%zu err=%s\n", cmd, admitted, cudaGetErrorName(e));
  return 0;
}
