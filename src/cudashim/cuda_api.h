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
typedef struct CUgreenCtx_st* CUgreenCtx;
// cuCtxSetLimit's limits (those below 0x05 reserve device memory when set).
typedef enum CUlimit_enum {
  CU_LIMIT_STACK_SIZE = 0x00,
  CU_LIMIT_PRINTF_FIFO_SIZE = 0x01,
  CU_LIMIT_MALLOC_HEAP_SIZE = 0x02,
  CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH = 0x03,
  CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT = 0x04,
  CU_LIMIT_MAX_L2_FETCH_GRANULARITY = 0x05,
  CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06,
} CUlimit;
typedef struct CUdevResourceDesc_st* CUdevResourceDesc;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef struct CUarray_st* CUarray;
typedef struct CUmipmappedArray_st* CUmipmappedArray;
typedef struct CUmemPoolHandle_st* CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctxCreateParams_st CUctxCreateParams;  // cuCtxCreate_v4; passed through
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphExec_st* CUgraphExec;
typedef struct CUgraphNode_st* CUgraphNode;
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
  CUDA_ERROR_ILLEGAL_STATE = 401,
  CUDA_ERROR_NOT_PERMITTED = 800,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
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
  CU_AD_FORMAT_NV12 = 0xb0,
  CU_AD_FORMAT_UNORM_INT8X1 = 0xc0,
  CU_AD_FORMAT_UNORM_INT8X2 = 0xc1,
  CU_AD_FORMAT_UNORM_INT8X4 = 0xc2,
  CU_AD_FORMAT_UNORM_INT16X1 = 0xc3,
  CU_AD_FORMAT_UNORM_INT16X2 = 0xc4,
  CU_AD_FORMAT_UNORM_INT16X4 = 0xc5,
  CU_AD_FORMAT_SNORM_INT8X1 = 0xc6,
  CU_AD_FORMAT_SNORM_INT8X2 = 0xc7,
  CU_AD_FORMAT_SNORM_INT8X4 = 0xc8,
  CU_AD_FORMAT_SNORM_INT16X1 = 0xc9,
  CU_AD_FORMAT_SNORM_INT16X2 = 0xca,
  CU_AD_FORMAT_SNORM_INT16X4 = 0xcb,
  CU_AD_FORMAT_BC1_UNORM = 0x91,
  CU_AD_FORMAT_BC1_UNORM_SRGB = 0x92,
  CU_AD_FORMAT_BC2_UNORM = 0x93,
  CU_AD_FORMAT_BC2_UNORM_SRGB = 0x94,
  CU_AD_FORMAT_BC3_UNORM = 0x95,
  CU_AD_FORMAT_BC3_UNORM_SRGB = 0x96,
  CU_AD_FORMAT_BC4_UNORM = 0x97,
  CU_AD_FORMAT_BC4_SNORM = 0x98,
  CU_AD_FORMAT_BC5_UNORM = 0x99,
  CU_AD_FORMAT_BC5_SNORM = 0x9a,
  CU_AD_FORMAT_BC6H_UF16 = 0x9b,
  CU_AD_FORMAT_BC6H_SF16 = 0x9c,
  CU_AD_FORMAT_BC7_UNORM = 0x9d,
  CU_AD_FORMAT_BC7_UNORM_SRGB = 0x9e,
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
  CUDA_ARRAY3D_SPARSE = 0x40,
  CUDA_ARRAY3D_DEFERRED_MAPPING = 0x80,
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
typedef enum {
  CU_MEM_HANDLE_TYPE_NONE = 0,
  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
} CUmemAllocationHandleType;

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

typedef enum {
  CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,
  CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,
  CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2,
  CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3,
} CUgraphMem_attribute;

typedef enum {
  CU_STREAM_CAPTURE_STATUS_NONE = 0,
  CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
  CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
} CUstreamCaptureStatus;
typedef int CUstreamCaptureMode;

typedef struct CUmemAccessDesc_st CUmemAccessDesc;  // passed through

// cuGraphAddMemAllocNode's parameters (v1 layout).
typedef struct {
  CUmemPoolProps poolProps;
  const CUmemAccessDesc* accessDescs;
  size_t accessDescCount;
  size_t bytesize;
  CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;

typedef struct {
  cuuint64_t flags;
  CUstream hUploadStream;
  CUgraphNode hErrNode_out;
  int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

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
  X(cuCtxSynchronize_v2, cuCtxSynchronize, 13000, 0, CUresult, (CUcontext ctx))                    \
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
  X(cuLibraryUnload, cuLibraryUnload, 12000, 0, CUresult, (CUlibrary library))                     \
  X(cuModuleLoad, cuModuleLoad, 2000, 0, CUresult, (CUmodule * module, const char* fname))         \
  X(cuModuleLoadFatBinary, cuModuleLoadFatBinary, 2000, 0, CUresult,                               \
    (CUmodule * module, const void* fatCubin))                                                     \
  X(cuLibraryLoadFromFile, cuLibraryLoadFromFile, 12000, 0, CUresult,                              \
    (CUlibrary * library, const char* fileName, CUjit_option* jitOptions, void** jitOptionsValues, \
     unsigned int numJitOptions, void* libraryOptions, void** libraryOptionValues,                 \
     unsigned int numLibraryOptions))                                                              \
  X(cuGreenCtxCreate, cuGreenCtxCreate, 12040, 0, CUresult,                                        \
    (CUgreenCtx * phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags))                \
  X(cuGreenCtxDestroy, cuGreenCtxDestroy, 12040, 0, CUresult, (CUgreenCtx hCtx))                   \
  X(cuCtxSetLimit, cuCtxSetLimit, 3010, 0, CUresult, (CUlimit limit, size_t value))                \
  X(cuMemMap, cuMemMap, 10020, 0, CUresult,                                                        \
    (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,             \
     unsigned long long flags))                                                                    \
  X(cuMemUnmap, cuMemUnmap, 10020, 0, CUresult, (CUdeviceptr ptr, size_t size))                    \
  X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, 0, CUresult,                  \
    (CUmemGenericAllocationHandle * handle, void* addr))                                           \
  X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, 0, CUresult,                \
    (void* shareableHandle, CUmemGenericAllocationHandle handle,                                   \
     CUmemAllocationHandleType handleType, unsigned long long flags))                              \
  X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020, 0, CUresult,            \
    (CUmemGenericAllocationHandle * handle, void* osHandle,                                        \
     CUmemAllocationHandleType shHandleType))                                                      \
  X(cuEventSynchronize, cuEventSynchronize, 2000, 0, CUresult, (CUevent hEvent))                   \
  X(cuStreamBeginCapture_v2, cuStreamBeginCapture, 10010, 0, CUresult,                             \
    (CUstream hStream, CUstreamCaptureMode mode))                                                  \
  X(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture, 10010, 1, CUresult,                        \
    (CUstream hStream, CUstreamCaptureMode mode))                                                  \
  X(cuStreamEndCapture, cuStreamEndCapture, 10000, 0, CUresult,                                    \
    (CUstream hStream, CUgraph * phGraph))                                                         \
  X(cuStreamEndCapture_ptsz, cuStreamEndCapture, 10000, 1, CUresult,                               \
    (CUstream hStream, CUgraph * phGraph))                                                         \
  X(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, 0, CUresult,                            \
    (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,                   \
     size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams))                              \
  X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0, CUresult,                  \
    (CUgraphExec * phGraphExec, CUgraph hGraph, unsigned long long flags))                         \
  X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, 0, CUresult,                \
    (CUgraphExec * phGraphExec, CUgraph hGraph,                                                    \
     CUDA_GRAPH_INSTANTIATE_PARAMS * instantiateParams))                                           \
  X(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, 12000, 1, CUresult,           \
    (CUgraphExec * phGraphExec, CUgraph hGraph,                                                    \
     CUDA_GRAPH_INSTANTIATE_PARAMS * instantiateParams))                                           \
  X(cuGraphLaunch, cuGraphLaunch, 10000, 0, CUresult, (CUgraphExec hGraphExec, CUstream hStream))  \
  X(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, 1, CUresult,                                         \
    (CUgraphExec hGraphExec, CUstream hStream))                                                    \
  X(cuGraphUpload, cuGraphUpload, 11010, 0, CUresult, (CUgraphExec hGraphExec, CUstream hStream))  \
  X(cuGraphUpload_ptsz, cuGraphUpload, 11010, 1, CUresult,                                         \
    (CUgraphExec hGraphExec, CUstream hStream))                                                    \
  X(cuGraphExecDestroy, cuGraphExecDestroy, 10000, 0, CUresult, (CUgraphExec hGraphExec))          \
  X(cuGraphDestroy, cuGraphDestroy, 10000, 0, CUresult, (CUgraph hGraph))                          \
  X(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, 11040, 0, CUresult, (CUdevice device))

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
#define GPULET_CUDA_PLAIN(X)                                                                      \
  X(cuDriverGetVersion, cuDriverGetVersion, 2020, 0, CUresult, (int* driverVersion))              \
  X(cuDeviceGet, cuDeviceGet, 2000, 0, CUresult, (CUdevice * device, int ordinal))                \
  X(cuDeviceGetCount, cuDeviceGetCount, 2000, 0, CUresult, (int* count))                          \
  X(cuDeviceGetUuid, cuDeviceGetUuid, 9020, 0, CUresult, (CUuuid * uuid, CUdevice dev))           \
  X(cuDeviceGetUuid_v2, cuDeviceGetUuid, 11040, 0, CUresult, (CUuuid * uuid, CUdevice dev))       \
  X(cuCtxGetDevice, cuCtxGetDevice, 2000, 0, CUresult, (CUdevice * device))                       \
  X(cuCtxGetLimit, cuCtxGetLimit, 3010, 0, CUresult, (size_t * pvalue, CUlimit limit))            \
  X(cuCtxGetCurrent, cuCtxGetCurrent, 4000, 0, CUresult, (CUcontext * pctx))                      \
  X(cuCtxSetCurrent, cuCtxSetCurrent, 4000, 0, CUresult, (CUcontext ctx))                         \
  X(cuMemPoolGetAttribute, cuMemPoolGetAttribute, 11020, 0, CUresult,                             \
    (CUmemoryPool pool, CUmemPool_attribute attr, void* value))                                   \
  X(cuArrayGetMemoryRequirements, cuArrayGetMemoryRequirements, 11060, 0, CUresult,               \
    (CUDA_ARRAY_MEMORY_REQUIREMENTS * memoryRequirements, CUarray array, CUdevice device))        \
  X(cuMipmappedArrayGetMemoryRequirements, cuMipmappedArrayGetMemoryRequirements, 11060, 0,       \
    CUresult,                                                                                     \
    (CUDA_ARRAY_MEMORY_REQUIREMENTS * memoryRequirements, CUmipmappedArray mipmap,                \
     CUdevice device))                                                                            \
  X(cuGetExportTable, cuGetExportTable, 3000, 0, CUresult,                                        \
    (const void** ppExportTable, const CUuuid* pExportTableId))                                   \
  X(cuLaunchKernel, cuLaunchKernel, 4000, 0, CUresult,                                            \
    (void* f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,                \
     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                      \
     unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra))           \
  X(cuStreamIsCapturing, cuStreamIsCapturing, 10000, 0, CUresult,                                 \
    (CUstream hStream, CUstreamCaptureStatus * captureStatus))                                    \
  X(cuStreamGetCtx, cuStreamGetCtx, 9020, 0, CUresult, (CUstream hStream, CUcontext * pctx))      \
  X(cuCtxPushCurrent_v2, cuCtxPushCurrent, 4000, 0, CUresult, (CUcontext ctx))                    \
  X(cuCtxPopCurrent_v2, cuCtxPopCurrent, 4000, 0, CUresult, (CUcontext * pctx))                   \
  X(cuDeviceGetGraphMemAttribute, cuDeviceGetGraphMemAttribute, 11040, 0, CUresult,               \
    (CUdevice device, CUgraphMem_attribute attr, void* value))                                    \
  X(cuStreamCreate, cuStreamCreate, 2000, 0, CUresult, (CUstream * phStream, unsigned int Flags)) \
  X(cuStreamDestroy_v2, cuStreamDestroy, 4000, 0, CUresult, (CUstream hStream))                   \
  X(cuMemAddressReserve, cuMemAddressReserve, 10020, 0, CUresult,                                 \
    (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr,                          \
     unsigned long long flags))                                                                   \
  X(cuMemAddressFree, cuMemAddressFree, 10020, 0, CUresult, (CUdeviceptr ptr, size_t size))       \
  X(cuGraphCreate, cuGraphCreate, 10000, 0, CUresult, (CUgraph * phGraph, unsigned int flags))    \
  X(cuGraphAddMemFreeNode, cuGraphAddMemFreeNode, 11040, 0, CUresult,                             \
    (CUgraphNode * phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,                  \
     size_t numDependencies, CUdeviceptr dptr))                                                   \
  X(cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, 0, CUresult,                             \
    (CUmemoryPool pool, CUmemPool_attribute attr, void* value))                                   \
  X(cuEventCreate, cuEventCreate, 2000, 0, CUresult, (CUevent * phEvent, unsigned int Flags))     \
  X(cuEventDestroy_v2, cuEventDestroy, 4000, 0, CUresult, (CUevent hEvent))

#define GPULET_CUDA_DECLARE(name, base, since, ptsz, ret, params) ret name params;
GPULET_CUDA_WRAPPED(GPULET_CUDA_DECLARE)
GPULET_CUDA_PLAIN(GPULET_CUDA_DECLARE)
#undef GPULET_CUDA_DECLARE

}  // extern "C"

namespace gpulet::cudashim {

// The storage of one block of an array format: `bytes` for `width` x `height` elements (1 x 1
// for the plain formats, 4 x 4 for block compression, 2 x 2 for NV12's luma plus shared chroma).
// `per_channel`: `bytes` is per channel (the classic formats, NumChannels of them). All zero for a
// format not listed above.
struct ArrayFormatBlock {
  uint32_t bytes = 0;
  uint32_t width = 0;
  uint32_t height = 0;
  bool per_channel = false;
};

inline ArrayFormatBlock ArrayFormatStorage(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return {1, 1, 1, true};
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return {2, 1, 1, true};
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return {4, 1, 1, true};
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1:
      return {1, 1, 1, false};
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1:
      return {2, 1, 1, false};
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
      return {4, 1, 1, false};
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
      return {8, 1, 1, false};
    case CU_AD_FORMAT_BC1_UNORM:
    case CU_AD_FORMAT_BC1_UNORM_SRGB:
    case CU_AD_FORMAT_BC4_UNORM:
    case CU_AD_FORMAT_BC4_SNORM:
      return {8, 4, 4, false};
    case CU_AD_FORMAT_BC2_UNORM:
    case CU_AD_FORMAT_BC2_UNORM_SRGB:
    case CU_AD_FORMAT_BC3_UNORM:
    case CU_AD_FORMAT_BC3_UNORM_SRGB:
    case CU_AD_FORMAT_BC5_UNORM:
    case CU_AD_FORMAT_BC5_SNORM:
    case CU_AD_FORMAT_BC6H_UF16:
    case CU_AD_FORMAT_BC6H_SF16:
    case CU_AD_FORMAT_BC7_UNORM:
    case CU_AD_FORMAT_BC7_UNORM_SRGB:
      return {16, 4, 4, false};
    case CU_AD_FORMAT_NV12:
      return {6, 2, 2, false};
  }
  return {};
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
