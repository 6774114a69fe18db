// The CUDA runtime under libgpulet-cuda.so on a real GPU (scripts/device-check-memory-limits.sh).
// The runtime reaches the driver only through cuGetProcAddress, so every line below also checks
// that path. One command per run; each prints "key=value …":
//   malloc CHUNK   cudaMalloc until it fails
//   async CHUNK    cudaMallocAsync (+ stream synchronize) until it fails
//   vmm CHUNK      cuMemCreate on the device until it fails (CHUNK rounded to the granularity)
//   array CHUNK    cudaMallocArray (float, CHUNK bytes a row) until it fails
//   info           cudaMemGetInfo and a kernel launch
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

__global__ void Touch(int* p) { p[threadIdx.x] = threadIdx.x; }

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
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
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
    while ((e = cudaMallocArray(&a, &desc, width, height)) == cudaSuccess) admitted += width * height * 4;
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
