// Our own declarations of the parts of the CUDA driver API that the memory-limit library
// (libgpulet-cuda.so) and the simulated libcuda.so.1 (testing/cuda_sim) use, written from the
// public driver API reference: types, enum values, struct layouts, and each entry point's
// exported name, the base name cuGetProcAddress knows it by, and the CUDA version that introduced
// that variant. Nothing here needs the CUDA toolkit.
//
// Contract: every struct below keeps the exact layout of the driver's (x86-64 and aarch64 LP64),
// since the driver reads and writes memory the caller owns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

extern "C" {

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUlib_st* CUlibrary;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef struct CUarray_st* CUarray;
typedef struct CUmipmappedArray_st* CUmipmappedArray;
typedef struct CUmemPoolHandle_st* CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctxCreateParams_st CUctxCreateParams;      // cuCtxCreate_v4; passed through
typedef struct CUexecAffinityParam_st CUexecAffinityParam;  // cuCtxCreate_v3; passed through

enum : CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_OPERATING_SYSTEM = 304,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_UNKNOWN = 999,
};

// cuGetProcAddress flags and the _v2 symbol status.
enum : cuuint64_t {
  CU_GET_PROC_ADDRESS_DEFAULT = 0,
  CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
};
typedef enum {
  CU_GET_PROC_ADDRESS_SUCCESS = 0,
  CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
  CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

typedef struct {
  char bytes[16];
} CUuuid;

typedef enum {
  CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
  CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
  CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
  CU_AD_FORMAT_SIGNED_INT8 = 0x08,
  CU_AD_FORMAT_SIGNED_INT16 = 0x09,
  CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
  CU_AD_FORMAT_HALF = 0x10,
  CU_AD_FORMAT_FLOAT = 0x20,
} CUarray_format;

typedef struct {
  size_t Width;
  size_t Height;
  CUarray_format Format;
  unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
  size_t Width;
  size_t Height;
  size_t Depth;
  CUarray_format Format;
  unsigned int NumChannels;
  unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

enum : unsigned int {
  CUDA_ARRAY3D_LAYERED = 0x01,
  CUDA_ARRAY3D_CUBEMAP = 0x04,
};

typedef struct {
  size_t size;
  size_t alignment;
  unsigned int reserved[4];
} CUDA_ARRAY_MEMORY_REQUIREMENTS;

typedef enum {
  CU_MEM_LOCATION_TYPE_INVALID = 0,
  CU_MEM_LOCATION_TYPE_DEVICE = 1,
  CU_MEM_LOCATION_TYPE_HOST = 2,
  CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
  CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4,
} CUmemLocationType;

typedef struct {
  CUmemLocationType type;
  int id;
} CUmemLocation;

typedef enum { CU_MEM_ALLOCATION_TYPE_PINNED = 1 } CUmemAllocationType;
typedef enum { CU_MEM_HANDLE_TYPE_NONE = 0 } CUmemAllocationHandleType;

typedef struct {
  CUmemAllocationType type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;

typedef struct {
  CUmemAllocationType allocType;
  CUmemAllocationHandleType handleTypes;
  CUmemLocation location;
  void* win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
} CUmemPoolProps;

typedef enum {
  CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
  CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
  CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
} CUmemPool_attribute;

enum : unsigned int { CU_MEM_ATTACH_GLOBAL = 1 };

typedef int CUjit_option;

// The entry points that produce or release device memory, or report it: the library wraps every
// one. X(exported name, cuGetProcAddress base name, CUDA version of this variant, per-thread
// default stream variant (1) or not (0), return type, parameters).
#define GPULET_CUDA_WRAPPED(X)                                                                     \
  X(cuInit, cuInit, 2000, 0, CUresult, (unsigned int flags))                                       \
  X(cuGetProcAddress, cuGetProcAddress, 11030, 0, CUresult,                                        \
    (const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags))                           \
  X(cuGetProcAddress_v2, cuGetProcAddress, 12000, 0, CUresult,                                     \
    (const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,                            \
     CUdriverProcAddressQueryResult* symbolStatus))                                                \
  X(cuMemAlloc_v2, cuMemAlloc, 3020, 0, CUresult, (CUdeviceptr * dptr, size_t bytesize))           \
  X(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0, CUresult,                                        \
    (CUdeviceptr * dptr, size_t * pPitch, size_t WidthInBytes, size_t Height,                      \
     unsigned int ElementSizeBytes))                                                               \
  X(cuMemAllocManaged, cuMemAllocManaged, 6000, 0, CUresult,                                       \
    (CUdeviceptr * dptr, size_t bytesize, unsigned int flags))                                     \
  X(cuMemFree_v2, cuMemFree, 3020, 0, CUresult, (CUdeviceptr dptr))                                \
  X(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0, CUresult, (size_t * free, size_t * total))             \
  X(cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, 0, CUresult, (size_t * bytes, CUdevice dev))      \
  X(cuMemCreate, cuMemCreate, 10020, 0, CUresult,                                                  \
    (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp* prop,          \
     unsigned long long flags))                                                                    \
  X(cuMemRelease, cuMemRelease, 10020, 0, CUresult, (CUmemGenericAllocationHandle handle))         \
  X(cuMemAllocAsync, cuMemAllocAsync, 11020, 0, CUresult,                                          \
    (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))                                       \
  X(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 1, CUresult,                                     \
    (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))                                       \
  X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0, CUresult,                          \
    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream))                    \
  X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 1, CUresult,                     \
    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream))                    \
  X(cuMemFreeAsync, cuMemFreeAsync, 11020, 0, CUresult, (CUdeviceptr dptr, CUstream hStream))      \
  X(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1, CUresult, (CUdeviceptr dptr, CUstream hStream)) \
  X(cuMemPoolCreate, cuMemPoolCreate, 11020, 0, CUresult,                                          \
    (CUmemoryPool * pool, const CUmemPoolProps* poolProps))                                        \
  X(cuMemPoolDestroy, cuMemPoolDestroy, 11020, 0, CUresult, (CUmemoryPool pool))                   \
  X(cuMemPoolTrimTo, cuMemPoolTrimTo, 11020, 0, CUresult,                                          \
    (CUmemoryPool pool, size_t minBytesToKeep))                                                    \
  X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 11020, 0, CUresult,                      \
    (CUmemoryPool * pool, CUdevice dev))                                                           \
  X(cuDeviceGetMemPool, cuDeviceGetMemPool, 11020, 0, CUresult,                                    \
    (CUmemoryPool * pool, CUdevice dev))                                                           \
  X(cuStreamSynchronize, cuStreamSynchronize, 2000, 0, CUresult, (CUstream hStream))               \
  X(cuStreamSynchronize_ptsz, cuStreamSynchronize, 7000, 1, CUresult, (CUstream hStream))          \
  X(cuCtxSynchronize, cuCtxSynchronize, 2000, 0, CUresult, (void))                                 \
  X(cuArrayCreate_v2, cuArrayCreate, 3020, 0, CUresult,                                            \
    (CUarray * pHandle, const CUDA_ARRAY_DESCRIPTOR* pAllocateArray))                              \
  X(cuArray3DCreate_v2, cuArray3DCreate, 3020, 0, CUresult,                                        \
    (CUarray * pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray))                            \
  X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0, CUresult,                             \
    (CUmipmappedArray * pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pMipmappedArrayDesc,               \
     unsigned int numMipmapLevels))                                                                \
  X(cuArrayDestroy, cuArrayDestroy, 2000, 0, CUresult, (CUarray hArray))                           \
  X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0, CUresult,                           \
    (CUmipmappedArray hMipmappedArray))                                                            \
  X(cuCtxCreate_v2, cuCtxCreate, 3020, 0, CUresult,                                                \
    (CUcontext * pctx, unsigned int flags, CUdevice dev))                                          \
  X(cuCtxCreate_v3, cuCtxCreate, 11040, 0, CUresult,                                               \
    (CUcontext * pctx, CUexecAffinityParam * paramsArray, int numParams, unsigned int flags,       \
     CUdevice dev))                                                                                \
  X(cuCtxCreate_v4, cuCtxCreate, 12050, 0, CUresult,                                               \
    (CUcontext * pctx, CUctxCreateParams * params, unsigned int flags, CUdevice dev))              \
  X(cuCtxDestroy_v2, cuCtxDestroy, 4000, 0, CUresult, (CUcontext ctx))                             \
  X(cuCtxDestroy, cuCtxDestroy, 2000, 0, CUresult, (CUcontext ctx))                                \
  X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, 7000, 0, CUresult, (CUdevice dev))       \
  X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, 7000, 0, CUresult, (CUdevice dev))           \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, 0, CUresult,                         \
    (CUcontext * pctx, CUdevice dev))                                                              \
  X(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease, 11000, 0, CUresult, (CUdevice dev))   \
  X(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset, 11000, 0, CUresult, (CUdevice dev))       \
  X(cuModuleLoadData, cuModuleLoadData, 2000, 0, CUresult, (CUmodule * module, const void* image)) \
  X(cuModuleLoadDataEx, cuModuleLoadDataEx, 2010, 0, CUresult,                                     \
    (CUmodule * module, const void* image, unsigned int numOptions, CUjit_option* options,         \
     void** optionValues))                                                                         \
  X(cuModuleUnload, cuModuleUnload, 2000, 0, CUresult, (CUmodule hmod))                            \
  X(cuLibraryLoadData, cuLibraryLoadData, 12000, 0, CUresult,                                      \
    (CUlibrary * library, const void* code, CUjit_option* jitOptions, void** jitOptionsValues,     \
     unsigned int numJitOptions, void* libraryOptions, void** libraryOptionValues,                 \
     unsigned int numLibraryOptions))                                                              \
  X(cuLibraryUnload, cuLibraryUnload, 12000, 0, CUresult, (CUlibrary library))

// The 32-bit entry points from before CUDA 3.2 (still exported by the driver): their sizes and
// pointers are 32 bits wide. The library refuses them (CUDA_ERROR_NOT_SUPPORTED) rather than let
// memory through uncounted; no program built with a CUDA toolkit of the last fifteen years calls
// them. X(name, base, since).
#define GPULET_CUDA_LEGACY(X)                 \
  X(cuMemAlloc, cuMemAlloc, 2000)             \
  X(cuMemAllocPitch, cuMemAllocPitch, 2000)   \
  X(cuMemFree, cuMemFree, 2000)               \
  X(cuMemGetInfo, cuMemGetInfo, 2000)         \
  X(cuDeviceTotalMem, cuDeviceTotalMem, 2000) \
  X(cuArrayCreate, cuArrayCreate, 2000)       \
  X(cuArray3DCreate, cuArray3DCreate, 2000)   \
  X(cuCtxCreate, cuCtxCreate, 2000)

// Entry points the library does not wrap but calls itself (and the simulated driver implements).
#define GPULET_CUDA_PLAIN(X)                                                                \
  X(cuDriverGetVersion, cuDriverGetVersion, 2020, 0, CUresult, (int* driverVersion))        \
  X(cuDeviceGet, cuDeviceGet, 2000, 0, CUresult, (CUdevice * device, int ordinal))          \
  X(cuDeviceGetCount, cuDeviceGetCount, 2000, 0, CUresult, (int* count))                    \
  X(cuDeviceGetUuid, cuDeviceGetUuid, 9020, 0, CUresult, (CUuuid * uuid, CUdevice dev))     \
  X(cuDeviceGetUuid_v2, cuDeviceGetUuid, 11040, 0, CUresult, (CUuuid * uuid, CUdevice dev)) \
  X(cuCtxGetDevice, cuCtxGetDevice, 2000, 0, CUresult, (CUdevice * device))                 \
  X(cuCtxGetCurrent, cuCtxGetCurrent, 4000, 0, CUresult, (CUcontext * pctx))                \
  X(cuCtxSetCurrent, cuCtxSetCurrent, 4000, 0, CUresult, (CUcontext ctx))                   \
  X(cuMemPoolGetAttribute, cuMemPoolGetAttribute, 11020, 0, CUresult,                       \
    (CUmemoryPool pool, CUmemPool_attribute attr, void* value))                             \
  X(cuArrayGetMemoryRequirements, cuArrayGetMemoryRequirements, 11060, 0, CUresult,         \
    (CUDA_ARRAY_MEMORY_REQUIREMENTS * memoryRequirements, CUarray array, CUdevice device))  \
  X(cuMipmappedArrayGetMemoryRequirements, cuMipmappedArrayGetMemoryRequirements, 11060, 0, \
    CUresult,                                                                               \
    (CUDA_ARRAY_MEMORY_REQUIREMENTS * memoryRequirements, CUmipmappedArray mipmap,          \
     CUdevice device))                                                                      \
  X(cuGetExportTable, cuGetExportTable, 3000, 0, CUresult,                                  \
    (const void** ppExportTable, const CUuuid* pExportTableId))                             \
  X(cuLaunchKernel, cuLaunchKernel, 4000, 0, CUresult,                                      \
    (void* f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,          \
     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                \
     unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra))

#define GPULET_CUDA_DECLARE(name, base, since, ptsz, ret, params) ret name params;
GPULET_CUDA_WRAPPED(GPULET_CUDA_DECLARE)
GPULET_CUDA_PLAIN(GPULET_CUDA_DECLARE)
#undef GPULET_CUDA_DECLARE

}  // extern "C"

namespace gpulet::cudashim {

// Bytes per element channel of an array format; 0 for formats not listed above.
inline uint64_t ArrayFormatBytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
  }
  return 0;
}

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", the form NVML and the device plugin use.
inline std::string GpuUuidString(const CUuuid& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char out[48];
  std::snprintf(out, sizeof out,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

}  // namespace gpulet::cudashim
