// gpulet-cuda-region: writes or shows an accounting region by hand (the device plugin writes them
// on Allocate; this is for checks on a real GPU and for operators).
//
//   gpulet-cuda-region create [--passthrough] [--driver PATH] DIR GPU-UUID=BYTES [...]
//   gpulet-cuda-region show DIR [LIMITS-FILE]
//
// `create` writes DIR/memory.region (the container's, writable) and DIR/gpulet-cuda.limits (the
// limits: mount it read-only beside the library, as /usr/lib/gpulet/gpulet-cuda.limits);
// --driver names the CUDA driver library the interposer calls (an absolute path in the container).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cudashim/region.h"

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: gpulet-cuda-region create [--passthrough] [--driver PATH] DIR "
               "GPU-UUID=BYTES [GPU-UUID=BYTES ...]\n"
               "       gpulet-cuda-region show DIR [LIMITS-FILE]\n"
               "create writes DIR/memory.region (mode 0666, usage only) and DIR/%s (mode 0644:\n"
               "each GPU's limit; mount it read-only beside libgpulet-cuda.so). --driver PATH\n"
               "names the CUDA driver library the interposer calls (absolute, as the container\n"
               "sees it; default: the first of its fixed paths that exists). show prints the\n"
               "use, with the limits of LIMITS-FILE (default DIR/%s).\n",
               gpulet::cudashim::kLimitsFileName, gpulet::cudashim::kLimitsFileName);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using gpulet::cudashim::GpuLimit;
  if (argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    Usage();
    return 0;
  }
  if (argc >= 4 && std::strcmp(argv[1], "create") == 0) {
    bool passthrough = false;
    std::string driver;
    int first = 2;
    for (; first < argc && argv[first][0] == '-'; ++first) {
      if (std::strcmp(argv[first], "--passthrough") == 0) {
        passthrough = true;
      } else if (std::strcmp(argv[first], "--driver") == 0 && first + 1 < argc) {
        driver = argv[++first];
      } else {
        return Usage();
      }
    }
    if (argc < first + 2) return Usage();
    const std::string dir = argv[first];
    std::vector<GpuLimit> gpus;
    for (int i = first + 1; i < argc; ++i) {
      const char* eq = std::strrchr(argv[i], '=');
      char* end = nullptr;
      const unsigned long long bytes = eq == nullptr ? 0 : std::strtoull(eq + 1, &end, 10);
      if (eq == nullptr || end == eq + 1 || *end != '\0') {
        std::fprintf(stderr, "gpulet-cuda-region: argument %d: \"%s\": want GPU-UUID=BYTES\n", i,
                     argv[i]);
        return 2;
      }
      gpus.push_back(GpuLimit{std::string(argv[i], static_cast<size_t>(eq - argv[i])), bytes, 0});
    }
    std::string err = gpulet::cudashim::CreateRegion(dir, gpus, /*replace=*/true);
    if (err.empty()) {
      err = gpulet::cudashim::WriteLimitsFile(dir + "/" + gpulet::cudashim::kLimitsFileName, gpus,
                                              passthrough, driver);
    }
    if (!err.empty()) {
      std::fprintf(stderr, "gpulet-cuda-region: %s\n", err.c_str());
      return 1;
    }
    return 0;
  }
  if ((argc == 3 || argc == 4) && std::strcmp(argv[1], "show") == 0) {
    gpulet::cudashim::Region r;
    const std::string limits =
        argc == 4 ? argv[3] : std::string(argv[2]) + "/" + gpulet::cudashim::kLimitsFileName;
    std::string err = r.Open(argv[2], /*read_only=*/true);
    if (err.empty()) err = r.LoadLimits(limits);
    if (!err.empty()) {
      std::fprintf(stderr, "gpulet-cuda-region: %s\n", err.c_str());
      return 1;
    }
    for (const auto& g : r.Usage()) {
      std::printf("%s limit=%llu used=%llu peak=%llu context=%llu\n", g.uuid.c_str(),
                  static_cast<unsigned long long>(g.limit), static_cast<unsigned long long>(g.used),
                  static_cast<unsigned long long>(g.peak),
                  static_cast<unsigned long long>(g.context_bytes));
    }
    return 0;
  }
  return Usage();
}
