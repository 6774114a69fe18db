// gpu::Nvml: the single seam between gpulet and the GPU driver.
//
// Load() dlopens an NVML library (the driver's libnvidia-ml.so.1, or our simulated one) and
// resolves the function table declared in nvml_api.h. Nothing above this class knows which
// library it got. One Nvml is one NVML session: Init() on construction, Shutdown() on
// destruction. The function table is immutable after Load(), so an Nvml may be shared by threads
// (NVML itself is thread-safe).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "gpu/nvml_api.h"

namespace gpulet::gpu {

struct NvmlFunctions {
#define GPULET_NVML_MEMBER(name, ret, params) ret(*name) params = nullptr;
  GPULET_NVML_ALL_FUNCTIONS(GPULET_NVML_MEMBER)
#undef GPULET_NVML_MEMBER
};

// Where to find the library when the caller names none: $GPULET_NVML_LIBRARY, else
// "libnvidia-ml.so.1" through the dynamic loader's search path.
std::string DefaultNvmlLibraryPath();

class Nvml {
 public:
  // Loads `library_path`, resolves every required symbol and calls nvmlInit_v2.
  // Errors: kNvmlLibraryMissing, kNvmlSymbolMissing (names the symbol), kNvmlInitFailed.
  static Result<std::shared_ptr<Nvml>> Load(const std::string& library_path);

  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  const NvmlFunctions& fn() const { return fn_; }
  const std::string& library_path() const { return path_; }
  // "NVML_ERROR_GPU_IS_LOST (GPU is lost)"-style text for a return code.
  std::string ErrorText(nvmlReturn_t rc) const;

 private:
  Nvml() = default;
  void* handle_ = nullptr;
  bool initialized_ = false;
  std::string path_;
  NvmlFunctions fn_;
};

// Symbolic name of an NVML return code ("NVML_ERROR_GPU_IS_LOST"), independent of any library.
const char* NvmlReturnName(nvmlReturn_t rc);

}  // namespace gpulet::gpu
