#include "metrics/fields.h"

#include <algorithm>
#include <array>

namespace gpulet::metrics {
namespace {

constexpr MigScope P = MigScope::kParent;
constexpr MigScope I = MigScope::kInstance;
constexpr MigScope N = MigScope::kNone;
constexpr MigScope G = MigScope::kGpm;

// Types and units are those dcgm-exporter 4.8 publishes (its default-counters.csv and the DCGM
// field reference): clocks MHz, temperatures °C, power W (double), energy mJ, memory MiB.
const std::vector<FieldInfo>& Table() {
  static const std::vector<FieldInfo> table = {
      {"DCGM_FI_DEV_SM_CLOCK", Source::kSmClock, false, false, "MHz", P},
      {"DCGM_FI_DEV_MEM_CLOCK", Source::kMemClock, false, false, "MHz", P},
      {"DCGM_FI_DEV_GPU_TEMP", Source::kGpuTemp, false, false, "C", P},
      {"DCGM_FI_DEV_POWER_USAGE", Source::kPowerUsage, true, false, "W", P},
      {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", Source::kTotalEnergy, false, false, "mJ", P},
      {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", Source::kPcieReplay, false, false, "", P},
      {"DCGM_FI_DEV_GPU_UTIL", Source::kGpuUtil, false, false, "%", N},
      {"DCGM_FI_DEV_MEM_COPY_UTIL", Source::kMemCopyUtil, false, false, "%", N},
      {"DCGM_FI_DEV_ENC_UTIL", Source::kEncUtil, false, false, "%", N},
      {"DCGM_FI_DEV_DEC_UTIL", Source::kDecUtil, false, false, "%", N},
      {"DCGM_FI_DEV_XID_ERRORS", Source::kXid, false, false, "", P},
      {"DCGM_EXP_XID_ERRORS_COUNT", Source::kXidCount, false, false, "", P},
      {"DCGM_FI_DEV_FB_FREE", Source::kFbFree, false, false, "MiB", I},
      {"DCGM_FI_DEV_FB_USED", Source::kFbUsed, false, false, "MiB", I},
      {"DCGM_FI_DEV_FB_TOTAL", Source::kFbTotal, false, false, "MiB", I},
      {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", Source::kEccSbeVolatile, false, false, "", P},
      {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", Source::kEccDbeVolatile, false, false, "", P},
      {"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", Source::kEccSbeAggregate, false, false, "", P},
      {"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", Source::kEccDbeAggregate, false, false, "", P},
      {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", Source::kCorrRemappedRows, false, false, "", P},
      {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", Source::kUncorrRemappedRows, false, false, "", P},
      {"DCGM_FI_DEV_ROW_REMAP_PENDING", Source::kRowRemapPending, false, false, "", P},
      {"DCGM_FI_DEV_ROW_REMAP_FAILURE", Source::kRowRemapFailure, false, false, "", P},
      {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", Source::kThrottleReasons, false, false, "", P},
      {"DCGM_FI_DEV_MEMORY_TEMP", Source::kMemoryTemp, false, false, "C", P},
      {"DCGM_FI_DEV_FB_RESERVED", Source::kFbReserved, false, false, "MiB", I},
      {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", Source::kNvlinkBandwidth, false, false, "B", P},
      {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", Source::kProfGrEngineActive, true, false, "", G},
      {"DCGM_FI_PROF_SM_ACTIVE", Source::kProfSmActive, true, false, "", G},
      {"DCGM_FI_PROF_SM_OCCUPANCY", Source::kProfSmOccupancy, true, false, "", G},
      {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", Source::kProfTensorActive, true, false, "", G},
      {"DCGM_FI_PROF_DRAM_ACTIVE", Source::kProfDramActive, true, false, "", G},
      {"DCGM_FI_PROF_PIPE_FP64_ACTIVE", Source::kProfFp64Active, true, false, "", G},
      {"DCGM_FI_PROF_PIPE_FP32_ACTIVE", Source::kProfFp32Active, true, false, "", G},
      {"DCGM_FI_PROF_PIPE_FP16_ACTIVE", Source::kProfFp16Active, true, false, "", G},
      {"DCGM_FI_PROF_PCIE_TX_BYTES", Source::kProfPcieTxBytes, false, false, "B/s", G},
      {"DCGM_FI_PROF_PCIE_RX_BYTES", Source::kProfPcieRxBytes, false, false, "B/s", G},
      {"DCGM_FI_PROF_NVLINK_TX_BYTES", Source::kProfNvlinkTxBytes, false, false, "B/s", G},
      {"DCGM_FI_PROF_NVLINK_RX_BYTES", Source::kProfNvlinkRxBytes, false, false, "B/s", G},
      {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS", Source::kThrottleReasons, false, false, "", P},
      {"DCGM_FI_DRIVER_VERSION", Source::kDriverVersion, false, true, "", P},
      {"DCGM_FI_CUDA_DRIVER_VERSION", Source::kCudaDriverVersion, false, true, "", P},
      {"DCGM_FI_DEV_NAME", Source::kDeviceName, false, true, "", P},
      {"DCGM_FI_DEV_UUID", Source::kDeviceUuid, false, true, "", P},
      {"DCGM_FI_DEV_PCI_BUSID", Source::kPciBusId, false, true, "", P},
  };
  return table;
}

// Real DCGM fields without an NVML reading gpulet binds today (DCGM_EXP_* are computed by
// dcgm-exporter itself; the rest have NVML sources gpulet does not read yet).
constexpr std::array<std::string_view, 77> kKnownUnsupported = {
    "DCGM_FI_DEV_FB_USED_PERCENT",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_POWER_USAGE_INSTANT",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_PSTATE",
    "DCGM_FI_DEV_FAN_SPEED",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "DCGM_FI_DEV_APP_SM_CLOCK",
    "DCGM_FI_DEV_APP_MEM_CLOCK",
    "DCGM_FI_DEV_VIDEO_CLOCK",
    "DCGM_FI_DEV_MAX_SM_CLOCK",
    "DCGM_FI_DEV_MAX_MEM_CLOCK",
    "DCGM_FI_DEV_MAX_VIDEO_CLOCK",
    "DCGM_FI_DEV_SLOWDOWN_TEMP",
    "DCGM_FI_DEV_SHUTDOWN_TEMP",
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP",
    "DCGM_FI_DEV_MEM_MAX_OP_TEMP",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_LINK_GEN",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
    "DCGM_FI_DEV_ECC_CURRENT",
    "DCGM_FI_DEV_ECC_PENDING",
    "DCGM_FI_DEV_COMPUTE_MODE",
    "DCGM_FI_DEV_PERSISTENCE_MODE",
    "DCGM_FI_DEV_MIG_MODE",
    "DCGM_FI_DEV_COUNT",
    "DCGM_FI_DEV_BRAND",
    "DCGM_FI_DEV_SERIAL",
    "DCGM_FI_DEV_MINOR_NUMBER",
    "DCGM_FI_DEV_OEM_INFOROM_VER",
    "DCGM_FI_DEV_ECC_INFOROM_VER",
    "DCGM_FI_DEV_POWER_INFOROM_VER",
    "DCGM_FI_DEV_INFOROM_IMAGE_VER",
    "DCGM_FI_DEV_VBIOS_VERSION",
    "DCGM_FI_NVML_VERSION",
    "DCGM_FI_PROCESS_NAME",
    "DCGM_FI_DEV_POWER_USAGE_MAX",
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_INT_ACTIVE",
    "DCGM_FI_PROF_NVDEC0_ACTIVE",
    "DCGM_FI_PROF_NVENC0_ACTIVE",
    "DCGM_FI_PROF_NVJPG0_ACTIVE",
    "DCGM_FI_PROF_NVOFA0_ACTIVE",
    "DCGM_FI_DEV_NVSWITCH_LINK_THROUGHPUT_TX",
    "DCGM_FI_DEV_NVSWITCH_LINK_THROUGHPUT_RX",
    "DCGM_FI_DEV_CPU_UTIL_TOTAL",
    "DCGM_FI_DEV_CPU_TEMP_CURRENT",
    "DCGM_FI_DEV_CPU_POWER_UTIL_CURRENT",
    "DCGM_EXP_CLOCK_EVENTS_COUNT",
    "DCGM_EXP_GPU_HEALTH_STATUS",
    "DCGM_EXP_P2P_STATUS",
    "DCGM_FI_DEV_XID_ERRORS_TOTAL",
    "DCGM_FI_DEV_CLOCK_EVENTS_TOTAL",
    "DCGM_FI_DEV_DIAG_MEMORY_RESULT",
    "DCGM_FI_DEV_ACCOUNTING_DATA",
    "DCGM_FI_DEV_BAR1_TOTAL",
    "DCGM_FI_DEV_BAR1_USED",
    "DCGM_FI_DEV_BAR1_FREE",
};

}  // namespace

const std::vector<FieldInfo>& SupportedFields() { return Table(); }

bool IsGpmSource(Source s) {
  return s >= Source::kProfGrEngineActive && s <= Source::kProfNvlinkRxBytes;
}

const FieldInfo* FindField(std::string_view name) {
  for (const FieldInfo& f : Table()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool IsKnownUnsupportedField(std::string_view name) {
  return std::find(kKnownUnsupported.begin(), kKnownUnsupported.end(), name) !=
         kKnownUnsupported.end();
}

}  // namespace gpulet::metrics
