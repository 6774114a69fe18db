// The simulated driver, part 3: field values, memory info v2, GPM profiling.
#include "sim/nvml_sim_driver.h"

// ---- Telemetry beyond the basic queries: field values, memory info v2, GPM profiling. ----
// Values follow the same generated telemetry as the basic queries, so a dashboard sees one
// consistent GPU: memory runs a few degrees cooler than the die, profiling ratios track GPU
// utilisation, DRAM activity tracks memory utilisation, link counters only grow.

struct nvmlGpmSample_st {
  bool taken = false;
  unsigned gpu = 0;
  int gpu_instance = -1;  // -1: the whole GPU
  int64_t at_ms = 0;
  unsigned gpu_util = 0;
  unsigned mem_util = 0;
  unsigned slice_share = 7;  // the instance's slices out of 7 (7 for a whole GPU)
  unsigned nvlinks = 0;
};

namespace gpulet::sim {
namespace {

unsigned NvlinksOf(const Fixture& f, const GpuSpec& g) {
  if (f.nvswitch_links > 0) return f.nvswitch_links;
  unsigned n = 0;
  if (g.index < f.nvlinks.size()) {
    for (unsigned links : f.nvlinks[g.index]) n += links;
  }
  return n;
}

// Cumulative NVLink traffic in KiB: grows with the energy counter (busy GPUs move more data).
uint64_t NvlinkKiB(const Telemetry& t, unsigned links, bool tx) {
  return links == 0 ? 0 : t.energy_mj / (tx ? 4 : 5) * links / 18;
}

bool GpmCapable(const GpuSpec& g) { return g.cc_major >= 9; }

}  // namespace
}  // namespace gpulet::sim

SIM_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                                 nvmlFieldValue_t* values) {
  return PhysicalQuery(device, values != nullptr && valuesCount >= 0,
                       [&](Session& s, const gpulet::sim::GpuSpec& g) {
                         const gpulet::sim::Telemetry now = gpulet::sim::Now(s, g);
                         const unsigned links = gpulet::sim::NvlinksOf(s.d.fixture, g);
                         for (int i = 0; i < valuesCount; ++i) {
                           nvmlFieldValue_t& v = values[i];
                           v.timestamp = gpulet::sim::WallClockMs() * 1000;
                           v.latencyUsec = 0;
                           v.nvmlReturn = NVML_SUCCESS;
                           switch (v.fieldId) {
                             case NVML_FI_DEV_MEMORY_TEMP:
                               v.valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                               v.value.uiVal = now.temperature_c > 3 ? now.temperature_c - 3 : 0;
                               break;
                             case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX:
                             case NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX:
                               if (links == 0) {
                                 v.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                                 break;
                               }
                               v.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                               v.value.ullVal = gpulet::sim::NvlinkKiB(
                                   now, links, v.fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX);
                               break;
                             default:
                               v.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                           }
                         }
                         return NVML_SUCCESS;
                       });
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  if (memory != nullptr && memory->version != nvmlMemory_v2)
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  return Guard([&]() -> nvmlReturn_t {
    Session s;
    Target t;
    if (nvmlReturn_t rc = Resolve(s, device, memory != nullptr, &t); rc != NVML_SUCCESS) return rc;
    const nvmlMemory_t v1 = gpulet::sim::MemoryOf(s, t);
    // The driver keeps about 1 % of the framebuffer (at most 512 MiB) for itself.
    constexpr unsigned long long kMiB = 1024ULL * 1024ULL;
    const unsigned long long reserved = std::min(v1.total / 100, 512 * kMiB);
    memory->total = v1.total;
    memory->reserved = reserved;
    memory->used = v1.used;
    memory->free = v1.free > reserved ? v1.free - reserved : 0;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t* support) {
  if (support != nullptr && support->version != NVML_GPM_SUPPORT_VERSION) {
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  }
  return PhysicalQuery(device, support != nullptr, [&](Session&, const gpulet::sim::GpuSpec& g) {
    support->isSupportedDevice = gpulet::sim::GpmCapable(g) ? 1 : 0;
    return NVML_SUCCESS;
  });
}

SIM_EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t* sample) {
  if (sample == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *sample = new nvmlGpmSample_st();
  return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
  if (sample == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  delete sample;
  return NVML_SUCCESS;
}

namespace {

nvmlReturn_t TakeGpmSample(nvmlDevice_t device, int gpu_instance, nvmlGpmSample_t sample) {
  return PhysicalQuery(device, sample != nullptr, [&](Session& s, const gpulet::sim::GpuSpec& g) {
    if (!gpulet::sim::GpmCapable(g)) return NVML_ERROR_NOT_SUPPORTED;
    unsigned slices = 7;
    if (gpu_instance >= 0) {
      const gpulet::sim::MigDeviceSpec* found = nullptr;
      for (const gpulet::sim::MigDeviceSpec& m : g.mig) {
        if (static_cast<int>(m.gi) == gpu_instance) found = &m;
      }
      if (found == nullptr) return NVML_ERROR_NOT_FOUND;
      slices = found->facts.slices;
    }
    const gpulet::sim::Telemetry now = gpulet::sim::Now(s, g);
    sample->taken = true;
    sample->gpu = g.index;
    sample->gpu_instance = gpu_instance;
    sample->at_ms = gpulet::sim::WallClockMs();
    sample->gpu_util = now.gpu_util;
    sample->mem_util = now.mem_util;
    sample->slice_share = slices;
    sample->nvlinks = gpulet::sim::NvlinksOf(s.d.fixture, g);
    return NVML_SUCCESS;
  });
}

}  // namespace

SIM_EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
  return TakeGpmSample(device, -1, sample);
}

SIM_EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                            nvmlGpmSample_t sample) {
  return TakeGpmSample(device, static_cast<int>(gpuInstanceId), sample);
}

SIM_EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t* metricsGet) {
  if (metricsGet == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION) {
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  }
  const nvmlGpmSample_st* a = metricsGet->sample1;
  const nvmlGpmSample_st* b = metricsGet->sample2;
  if (a == nullptr || b == nullptr || !a->taken || !b->taken || a->gpu != b->gpu ||
      a->gpu_instance != b->gpu_instance || b->at_ms < a->at_ms ||
      metricsGet->numMetrics > kNvmlGpmMetricsCapacity) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  // Interval averages: the mean of the two ends of the interval.
  const double util = (a->gpu_util + b->gpu_util) / 2.0;
  const double mem = (a->mem_util + b->mem_util) / 2.0;
  const double share = b->slice_share / 7.0;
  for (unsigned i = 0; i < metricsGet->numMetrics; ++i) {
    nvmlGpmMetric_t& m = metricsGet->metrics[i];
    m.nvmlReturn = NVML_SUCCESS;
    m.metricInfo = {nullptr, nullptr, nullptr};
    switch (m.metricId) {
      case NVML_GPM_METRIC_GRAPHICS_UTIL:
        m.value = util;
        break;
      case NVML_GPM_METRIC_SM_UTIL:
        m.value = util * 0.9;
        break;
      case NVML_GPM_METRIC_SM_OCCUPANCY:
        m.value = util * 0.6;
        break;
      case NVML_GPM_METRIC_ANY_TENSOR_UTIL:
        m.value = util * 0.5;
        break;
      case NVML_GPM_METRIC_DRAM_BW_UTIL:
        m.value = mem;
        break;
      case NVML_GPM_METRIC_FP64_UTIL:
        m.value = util * 0.1;
        break;
      case NVML_GPM_METRIC_FP32_UTIL:
        m.value = util * 0.3;
        break;
      case NVML_GPM_METRIC_FP16_UTIL:
        m.value = util * 0.2;
        break;
      case NVML_GPM_METRIC_PCIE_TX_PER_SEC:
        m.value = mem * 120.0 * share;
        break;  // MiB/s
      case NVML_GPM_METRIC_PCIE_RX_PER_SEC:
        m.value = mem * 160.0 * share;
        break;
      case NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC:
      case NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC:
        m.value =
            util * (m.metricId == NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC ? 900.0 : 850.0) * share;
        if (b->nvlinks == 0) m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        break;
      default:
        m.value = 0;
        m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
  }
  return NVML_SUCCESS;
}
