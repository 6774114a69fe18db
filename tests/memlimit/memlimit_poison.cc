// A tenant's library that exports no-op functions under the driver's names (issue 36 item 1): a
// program that looks one up with dlsym before any CUDA call must not make it the interposer's
// idea of the driver. Loaded by memlimit_model's driver-first scenario.
#include "cudashim/cuda_api.h"

#define POISON_EXPORT extern "C" __attribute__((visibility("default")))

// Frees nothing: were the interposer to call it for the driver's, the driver would keep every
// allocation while the region gave each charge back.
POISON_EXPORT CUresult cuMemFree_v2(CUdeviceptr) { return CUDA_SUCCESS; }
POISON_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  *device = 7;  // no such device in the fixture: a table that took this would refuse or misplace
  return CUDA_SUCCESS;
}
