// gpulet-cuda-region: writes or shows an accounting region by hand (the device plugin writes them
// on Allocate; this is for checks on a real GPU and for operators).
//
//   gpulet-cuda-region create DIR GPU-UUID=BYTES [GPU-UUID=BYTES …]
//   gpulet-cuda-region show DIR
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cudashim/region.h"

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: gpulet-cuda-region create DIR GPU-UUID=BYTES [GPU-UUID=BYTES ...]\n"
               "       gpulet-cuda-region show DIR\n"
               "Writes DIR/memory.region (mode 0666) with each GPU's limit, or prints its use.\n");
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
    std::vector<GpuLimit> gpus;
    for (int i = 3; i < argc; ++i) {
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
    const std::string err = gpulet::cudashim::CreateRegion(argv[2], gpus, /*replace=*/true);
    if (!err.empty()) {
      std::fprintf(stderr, "gpulet-cuda-region: %s\n", err.c_str());
      return 1;
    }
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "show") == 0) {
    gpulet::cudashim::Region r;
    const std::string err = r.Open(argv[2], /*read_only=*/true);
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
