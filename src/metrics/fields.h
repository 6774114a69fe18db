// The DCGM field names gpulet's exporter understands, and how each is read through NVML.
//
// dcgm-exporter reads "fields" from DCGM's host engine; gpulet reads the same facts straight from
// NVML and publishes them under DCGM's names, types and units (those of dcgm-exporter 4.8), so
// dashboards and alerts built for dcgm-exporter keep working. Three kinds of names exist:
//   - supported:  FindField() returns how to read it;
//   - known:      a real DCGM field gpulet cannot read through NVML (profiling counters, NVLink
//                 throughput, …). A counters file may name it; the row is skipped with one log
//                 line;
//   - unknown:    anything else. A counters file naming it is rejected (probably a typo).
#pragma once

#include <string_view>
#include <vector>

namespace gpulet::metrics {

// Where a field's value comes from. One NVML call may feed several sources (utilisation rates
// give GPU and memory-copy utilisation); the sampler reads each call at most once per entity.
enum class Source {
  kSmClock,             // nvmlDeviceGetClockInfo(NVML_CLOCK_SM), MHz
  kMemClock,            // nvmlDeviceGetClockInfo(NVML_CLOCK_MEM), MHz
  kGpuTemp,             // nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU), °C
  kPowerUsage,          // nvmlDeviceGetPowerUsage, mW → W (double)
  kTotalEnergy,         // nvmlDeviceGetTotalEnergyConsumption, mJ
  kPcieReplay,          // nvmlDeviceGetPcieReplayCounter
  kGpuUtil,             // nvmlDeviceGetUtilizationRates().gpu, %
  kMemCopyUtil,         // nvmlDeviceGetUtilizationRates().memory, %
  kEncUtil,             // nvmlDeviceGetEncoderUtilization, %
  kDecUtil,             // nvmlDeviceGetDecoderUtilization, %
  kXid,                 // last XID seen through the NVML event API (0 = none yet)
  kXidCount,            // XIDs per code within --xid-count-window-size (DCGM_EXP_XID_ERRORS_COUNT)
  kFbFree,              // nvmlDeviceGetMemoryInfo().free, MiB
  kFbUsed,              // nvmlDeviceGetMemoryInfo().used, MiB
  kFbTotal,             // nvmlDeviceGetMemoryInfo().total, MiB
  kEccSbeVolatile,      // nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)
  kEccDbeVolatile,      // nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)
  kEccSbeAggregate,     // nvmlDeviceGetTotalEccErrors(CORRECTED, AGGREGATE)
  kEccDbeAggregate,     // nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE)
  kCorrRemappedRows,    // nvmlDeviceGetRemappedRows corrRows
  kUncorrRemappedRows,  // nvmlDeviceGetRemappedRows uncRows
  kRowRemapPending,     // nvmlDeviceGetRemappedRows isPending (0/1)
  kRowRemapFailure,     // nvmlDeviceGetRemappedRows failureOccurred (0/1)
  kThrottleReasons,     // nvmlDeviceGetCurrentClocksThrottleReasons bitmask
  kMemoryTemp,          // nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP), °C
  kFbReserved,          // nvmlDeviceGetMemoryInfo_v2().reserved, MiB
  kNvlinkBandwidth,     // field values NVLINK_THROUGHPUT_RAW_TX + RX over all links, KiB → bytes
  // GPM profiling (Hopper and newer): averages between two collections, as DCGM's ratios 0–1 or
  // bytes per second.
  kProfGrEngineActive,  // NVML_GPM_METRIC_GRAPHICS_UTIL / 100
  kProfSmActive,        // NVML_GPM_METRIC_SM_UTIL / 100
  kProfSmOccupancy,     // NVML_GPM_METRIC_SM_OCCUPANCY / 100
  kProfTensorActive,    // NVML_GPM_METRIC_ANY_TENSOR_UTIL / 100
  kProfDramActive,      // NVML_GPM_METRIC_DRAM_BW_UTIL / 100
  kProfFp64Active,      // NVML_GPM_METRIC_FP64_UTIL / 100
  kProfFp32Active,      // NVML_GPM_METRIC_FP32_UTIL / 100
  kProfFp16Active,      // NVML_GPM_METRIC_FP16_UTIL / 100
  kProfPcieTxBytes,     // NVML_GPM_METRIC_PCIE_TX_PER_SEC, MiB/s → bytes/s
  kProfPcieRxBytes,     // NVML_GPM_METRIC_PCIE_RX_PER_SEC, MiB/s → bytes/s
  kProfNvlinkTxBytes,   // NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, MiB/s → bytes/s
  kProfNvlinkRxBytes,   // NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, MiB/s → bytes/s
  // Label sources (values are strings from the Inventory).
  kDriverVersion,
  kCudaDriverVersion,
  kDeviceName,
  kDeviceUuid,
  kPciBusId,
};

// How a field behaves on a MIG GPU instance series.
enum class MigScope {
  kParent,    // a property of the physical GPU: the parent's value (what DCGM reports)
  kInstance,  // read through the MIG device handle (framebuffer)
  kNone,      // NVML has no per-instance reading (utilisation): left out of MIG series
  kGpm,       // GPM profiling: sampled per GPU instance through the parent (nvmlGpmMigSampleGet)
};

struct FieldInfo {
  std::string_view name;
  Source source;
  bool is_double;         // DCGM's type: DCGM_FT_DOUBLE (rendered "%f") or DCGM_FT_INT64
  bool is_label;          // a string field, usable only as a `label` row
  std::string_view unit;  // as dcgm-exporter's help text gives it, "" when unitless
  MigScope mig_scope;
};

// True for the GPM profiling sources (read by the sampler's GPM path, not per query).
bool IsGpmSource(Source s);

// The supported field named `name`, or nullptr.
const FieldInfo* FindField(std::string_view name);
// True for real DCGM field names that gpulet cannot read (see file comment).
bool IsKnownUnsupportedField(std::string_view name);
// Every supported field, in table order (for docs and tests).
const std::vector<FieldInfo>& SupportedFields();

}  // namespace gpulet::metrics
