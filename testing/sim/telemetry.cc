#include "sim/telemetry.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace gpulet::sim {
namespace {

constexpr int64_t kEpochMs = 1704067200000;  // 2024-01-01T00:00:00Z: counters start here
constexpr double kTwoPi = 6.283185307179586;
// Load = 0.5 + kA sin(kW1 t + p) + kB sin(kW2 t + 2p), always within [0, 1].
constexpr double kA = 0.35, kB = 0.15;
constexpr double kW1 = kTwoPi / 300.0, kW2 = kTwoPi / 47.0;

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

double Load(double t, double p) {
  return 0.5 + kA * std::sin(kW1 * t + p) + kB * std::sin(kW2 * t + 2 * p);
}

// Integral of Load from 0 to t (seconds); non-decreasing because Load >= 0.
double LoadIntegral(double t, double p) {
  return 0.5 * t + kA / kW1 * (std::cos(p) - std::cos(kW1 * t + p)) +
         kB / kW2 * (std::cos(2 * p) - std::cos(kW2 * t + 2 * p));
}

unsigned Percent(double x) {
  return static_cast<unsigned>(std::lround(std::clamp(x, 0.0, 1.0) * 100));
}

}  // namespace

int64_t WallClockMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Telemetry ComputeTelemetry(const Fixture& fixture, const GpuSpec& gpu, int64_t now_ms,
                           const GpuOverrides* o) {
  const uint64_t h = Mix(fixture.seed * 0x100000001B3ULL + gpu.index + 1);
  const double phase = static_cast<double>(h % 100000) / 100000.0 * kTwoPi;
  const double t = static_cast<double>(std::max<int64_t>(now_ms - kEpochMs, 0)) / 1000.0;
  const double load = Load(t, phase);
  const double slow = 0.5 + 0.5 * std::sin(kTwoPi * t / 900.0 + phase);

  Telemetry out;
  out.gpu_util = Percent(load);
  out.mem_util = Percent(load * (0.55 + 0.25 * slow));
  out.temperature_c = static_cast<unsigned>(std::lround(31 + 45 * Load(t - 20, phase)));
  const double idle = gpu.idle_power_w;
  const double span = gpu.power_limit_w > gpu.idle_power_w ? gpu.power_limit_w - idle : 0.0;
  out.power_mw = static_cast<unsigned>(std::lround((idle + span * load) * 1000));
  // Joules from the epoch, in mJ; integrating the same curve keeps energy consistent with power.
  out.energy_mj = static_cast<uint64_t>((idle * t + span * LoadIntegral(t, phase)) * 1000);
  out.memory_used_mib =
      static_cast<uint64_t>(static_cast<double>(gpu.memory_mib) * (0.08 + 0.72 * slow));
  out.sm_clock_mhz =
      static_cast<unsigned>(std::lround(gpu.max_sm_clock_mhz * (0.55 + 0.45 * load)));
  out.mem_clock_mhz = gpu.mem_clock_mhz;
  out.pcie_replays = static_cast<unsigned>(t / (86400.0 * (1 + h % 4)));
  out.ecc_corrected = static_cast<uint64_t>(t / (43200.0 * (1 + (h >> 8) % 8)));
  out.ecc_uncorrected = 0;

  if (o != nullptr) {
    if (o->temperature_c) out.temperature_c = *o->temperature_c;
    if (o->gpu_util) out.gpu_util = *o->gpu_util;
    if (o->mem_util) out.mem_util = *o->mem_util;
    if (o->power_w) out.power_mw = *o->power_w * 1000;
    if (o->memory_used_mib) out.memory_used_mib = std::min(*o->memory_used_mib, gpu.memory_mib);
    out.ecc_corrected += o->ecc_single_bit;
    out.ecc_uncorrected += o->ecc_double_bit;
  }
  return out;
}

}  // namespace gpulet::sim
