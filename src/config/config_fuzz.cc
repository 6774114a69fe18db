// libFuzzer target for the config parser. Beyond "no crash, no sanitizer report", it checks the
// parser's contract: every error is kInvalidInput and names the file and a line; every accepted
// config satisfies the validated invariants.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "config/config.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "config_fuzz: contract violated: %s\n", what);
    std::abort();
  }
}

void CheckSharing(const gpulet::config::ReplicaSharing& s) {
  Check(!s.resources.empty(), "accepted sharing section without resources");
  for (const auto& r : s.resources) {
    Check(r.replicas >= 2, "accepted replicas < 2");
    Check(r.name.rfind("nvidia.com/", 0) == 0, "accepted a name without nvidia.com/");
    Check(!r.advertised_name.empty(), "empty advertised name");
    Check(r.where.line >= 1, "resource without a line");
    using K = gpulet::config::DeviceSelection::Kind;
    Check(r.devices.kind != K::kCount || r.devices.count >= 1, "accepted device count < 1");
    Check(r.devices.kind != K::kList || !r.devices.list.empty(), "accepted empty device list");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = gpulet::config::ParseConfig(text, "fuzz.yaml");
  if (!c.ok()) {
    const gpulet::Status status = c.status();  // status() returns a copy: keep it alive
    const std::string& m = status.message();
    Check(status.code() == gpulet::ErrorCode::kInvalidInput, "error code is not kInvalidInput");
    Check(m.rfind("fuzz.yaml:", 0) == 0 && m.size() > 10 && m[10] >= '1' && m[10] <= '9',
          "error does not start with fuzz.yaml:<line>");
    return 0;
  }
  Check(!(c->sharing.time_slicing && c->sharing.mps), "accepted both timeSlicing and mps");
  if (c->sharing.time_slicing) CheckSharing(*c->sharing.time_slicing);
  if (c->sharing.mps) CheckSharing(*c->sharing.mps);
  if (c->flags.plugin.device_list_strategy) {
    Check(!c->flags.plugin.device_list_strategy->empty(), "accepted empty deviceListStrategy");
  }
  return 0;
}
