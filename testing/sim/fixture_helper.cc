// libgpulet-sim-yaml.so: parses a fixture's YAML for the simulated driver library, which does not
// link yaml-cpp (fixture_json.h says why). Loaded by that library only when no current parsed copy
// of the fixture is beside its state.
#include <cstdlib>
#include <cstring>
#include <string>

#include "sim/fixture.h"
#include "sim/fixture_json.h"

namespace {

char* Copy(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) char* gpulet_sim_parse_fixture(const char* text,
                                                                                 const char* file,
                                                                                 int* ok) {
  try {
    gpulet::Result<gpulet::sim::Fixture> fixture = gpulet::sim::ParseFixture(text, file);
    if (!fixture.ok()) {
      *ok = 0;
      return Copy(fixture.status().message());
    }
    *ok = 1;
    return Copy(gpulet::sim::FixtureToJson(*fixture).dump());
  } catch (const std::exception& e) {
    *ok = 0;
    return Copy(std::string("parsing the fixture: ") + e.what());
  }
}
