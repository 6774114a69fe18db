// Telemetry of a simulated GPU: a deterministic function of (fixture seed, GPU index, wall time),
// so every process reading the same node at the same moment sees the same values, and a demo
// looks alive. `gpulet sim set` overrides win over the generated values.
#pragma once

#include <cstdint>

#include "sim/control.h"
#include "sim/fixture.h"

namespace gpulet::sim {

struct Telemetry {
  unsigned temperature_c = 0;
  unsigned gpu_util = 0;  // percent
  unsigned mem_util = 0;  // percent
  unsigned power_mw = 0;
  uint64_t energy_mj = 0;  // since the simulation epoch; never decreases
  uint64_t memory_used_mib = 0;
  unsigned sm_clock_mhz = 0;
  unsigned mem_clock_mhz = 0;
  unsigned pcie_replays = 0;
  uint64_t ecc_corrected = 0;
  uint64_t ecc_uncorrected = 0;
};

// `now_ms`: milliseconds since the Unix epoch. `overrides` may be null.
Telemetry ComputeTelemetry(const Fixture& fixture, const GpuSpec& gpu, int64_t now_ms,
                           const GpuOverrides* overrides);

int64_t WallClockMs();

}  // namespace gpulet::sim
