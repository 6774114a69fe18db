#include "gpu/nvml.h"

#include <dlfcn.h>

#include <cstdlib>

namespace gpulet::gpu {

std::string DefaultNvmlLibraryPath() {
  const char* env = std::getenv("GPULET_NVML_LIBRARY");
  return (env != nullptr && *env != '\0') ? env : "libnvidia-ml.so.1";
}

const char* NvmlReturnName(nvmlReturn_t rc) {
  switch (rc) {
    case NVML_SUCCESS: return "NVML_SUCCESS";
    case NVML_ERROR_UNINITIALIZED: return "NVML_ERROR_UNINITIALIZED";
    case NVML_ERROR_INVALID_ARGUMENT: return "NVML_ERROR_INVALID_ARGUMENT";
    case NVML_ERROR_NOT_SUPPORTED: return "NVML_ERROR_NOT_SUPPORTED";
    case NVML_ERROR_NO_PERMISSION: return "NVML_ERROR_NO_PERMISSION";
    case NVML_ERROR_ALREADY_INITIALIZED: return "NVML_ERROR_ALREADY_INITIALIZED";
    case NVML_ERROR_NOT_FOUND: return "NVML_ERROR_NOT_FOUND";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "NVML_ERROR_INSUFFICIENT_SIZE";
    case NVML_ERROR_INSUFFICIENT_POWER: return "NVML_ERROR_INSUFFICIENT_POWER";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "NVML_ERROR_DRIVER_NOT_LOADED";
    case NVML_ERROR_TIMEOUT: return "NVML_ERROR_TIMEOUT";
    case NVML_ERROR_IRQ_ISSUE: return "NVML_ERROR_IRQ_ISSUE";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML_ERROR_LIBRARY_NOT_FOUND";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "NVML_ERROR_FUNCTION_NOT_FOUND";
    case NVML_ERROR_CORRUPTED_INFOROM: return "NVML_ERROR_CORRUPTED_INFOROM";
    case NVML_ERROR_GPU_IS_LOST: return "NVML_ERROR_GPU_IS_LOST";
    case NVML_ERROR_RESET_REQUIRED: return "NVML_ERROR_RESET_REQUIRED";
    case NVML_ERROR_OPERATING_SYSTEM: return "NVML_ERROR_OPERATING_SYSTEM";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "NVML_ERROR_LIB_RM_VERSION_MISMATCH";
    case NVML_ERROR_IN_USE: return "NVML_ERROR_IN_USE";
    case NVML_ERROR_MEMORY: return "NVML_ERROR_MEMORY";
    case NVML_ERROR_NO_DATA: return "NVML_ERROR_NO_DATA";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "NVML_ERROR_INSUFFICIENT_RESOURCES";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "NVML_ERROR_ARGUMENT_VERSION_MISMATCH";
    case NVML_ERROR_NOT_READY: return "NVML_ERROR_NOT_READY";
    case NVML_ERROR_GPU_NOT_FOUND: return "NVML_ERROR_GPU_NOT_FOUND";
    case NVML_ERROR_INVALID_STATE: return "NVML_ERROR_INVALID_STATE";
    default: return "NVML_ERROR_UNKNOWN";
  }
}

std::string Nvml::ErrorText(nvmlReturn_t rc) const {
  std::string text = NvmlReturnName(rc);
  if (fn_.nvmlErrorString != nullptr) {
    const char* detail = fn_.nvmlErrorString(rc);
    if (detail != nullptr && *detail != '\0') text += std::string(" (") + detail + ")";
  }
  return text;
}

Result<std::shared_ptr<Nvml>> Nvml::Load(const std::string& library_path) {
  // RTLD_LOCAL keeps the driver's symbols out of the global namespace; RTLD_NOW surfaces a broken
  // library here rather than at the first call.
  void* handle = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return Status(ErrorCode::kNvmlLibraryMissing,
                  "cannot load NVML library " + library_path + ": " + (why ? why : "unknown error") +
                      " (is the NVIDIA driver installed? use --nvml-library or --simulate)");
  }
  std::shared_ptr<Nvml> nvml(new Nvml());
  nvml->handle_ = handle;
  nvml->path_ = library_path;
#define GPULET_NVML_RESOLVE_REQUIRED(name, ret, params)                                       \
  nvml->fn_.name = reinterpret_cast<ret(*) params>(dlsym(handle, #name));                   \
  if (nvml->fn_.name == nullptr) {                                                          \
    return Status(ErrorCode::kNvmlSymbolMissing, "NVML library " + library_path +           \
                                                     " lacks required symbol " #name        \
                                                     " (driver too old or not NVML)");      \
  }
  GPULET_NVML_REQUIRED_FUNCTIONS(GPULET_NVML_RESOLVE_REQUIRED)
#undef GPULET_NVML_RESOLVE_REQUIRED
#define GPULET_NVML_RESOLVE_OPTIONAL(name, ret, params) \
  nvml->fn_.name = reinterpret_cast<ret(*) params>(dlsym(handle, #name));
  GPULET_NVML_OPTIONAL_FUNCTIONS(GPULET_NVML_RESOLVE_OPTIONAL)
  GPULET_NVML_TELEMETRY_FUNCTIONS(GPULET_NVML_RESOLVE_OPTIONAL)
  GPULET_NVML_PROCESS_FUNCTIONS(GPULET_NVML_RESOLVE_OPTIONAL)
#undef GPULET_NVML_RESOLVE_OPTIONAL

  nvmlReturn_t rc = nvml->fn_.nvmlInit_v2();
  if (rc != NVML_SUCCESS) {
    return Status(ErrorCode::kNvmlInitFailed,
                  "nvmlInit_v2 failed through " + library_path + ": " + nvml->ErrorText(rc));
  }
  nvml->initialized_ = true;
  return nvml;
}

Nvml::~Nvml() {
  if (initialized_ && fn_.nvmlShutdown != nullptr) fn_.nvmlShutdown();
  // The library stays mapped: NVML may keep threads of its own, and unloading under them is unsafe.
}

}  // namespace gpulet::gpu
