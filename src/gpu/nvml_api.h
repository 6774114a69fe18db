// Our own declarations of the parts of the NVML C API that gpulet uses, written from the public
// API reference (types, enum values, struct layouts). Nothing here links against NVML: the
// functions are resolved at run time by gpu::Nvml (dlopen), and the simulated driver in
// testing/sim exports the same symbols with the same signatures.
//
// Contract: every struct below must keep the exact layout of the driver's, since the driver
// writes into memory we own.
#pragma once

#include <cstdint>

extern "C" {

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlEventSet_st* nvmlEventSet_t;

enum : nvmlReturn_t {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_ALREADY_INITIALIZED = 5,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_INSUFFICIENT_POWER = 8,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_IRQ_ISSUE = 11,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_CORRUPTED_INFOROM = 14,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_RESET_REQUIRED = 16,
  NVML_ERROR_OPERATING_SYSTEM = 17,
  NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
  NVML_ERROR_IN_USE = 19,
  NVML_ERROR_MEMORY = 20,
  NVML_ERROR_NO_DATA = 21,
  NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
  NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
  NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
  NVML_ERROR_DEPRECATED = 26,
  NVML_ERROR_NOT_READY = 27,
  NVML_ERROR_GPU_NOT_FOUND = 28,
  NVML_ERROR_INVALID_STATE = 29,
  NVML_ERROR_UNKNOWN = 999,
};

// Buffer sizes the API documents for string getters.
enum : unsigned int {
  NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96,
  NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96,
  NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80,
  NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32,
  NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16,
  NVML_NVLINK_MAX_LINKS = 18,
};

typedef struct {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct {
  char busIdLegacy[16];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE, "0000:18:00.0"
} nvmlPciInfo_t;

typedef struct {
  unsigned int gpu;     // percent of time a kernel ran
  unsigned int memory;  // percent of time device memory was read or written
} nvmlUtilization_t;

typedef struct {
  unsigned int multiprocessorCount;
  unsigned int sharedCopyEngineCount;
  unsigned int sharedDecoderCount;
  unsigned int sharedEncoderCount;
  unsigned int sharedJpegCount;
  unsigned int sharedOfaCount;
  unsigned int gpuInstanceSliceCount;
  unsigned int computeInstanceSliceCount;
  unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;  // the XID for XidCriticalError events
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlEventData_t;

typedef unsigned int nvmlDeviceArchitecture_t;
enum : unsigned int {
  NVML_DEVICE_ARCH_KEPLER = 2,
  NVML_DEVICE_ARCH_MAXWELL = 3,
  NVML_DEVICE_ARCH_PASCAL = 4,
  NVML_DEVICE_ARCH_VOLTA = 5,
  NVML_DEVICE_ARCH_TURING = 6,
  NVML_DEVICE_ARCH_AMPERE = 7,
  NVML_DEVICE_ARCH_ADA = 8,
  NVML_DEVICE_ARCH_HOPPER = 9,
  NVML_DEVICE_ARCH_BLACKWELL = 10,
};

typedef enum {
  NVML_TOPOLOGY_INTERNAL = 0,
  NVML_TOPOLOGY_SINGLE = 10,
  NVML_TOPOLOGY_MULTIPLE = 20,
  NVML_TOPOLOGY_HOSTBRIDGE = 30,
  NVML_TOPOLOGY_NODE = 40,
  NVML_TOPOLOGY_SYSTEM = 50,
} nvmlGpuTopologyLevel_t;

typedef enum { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 } nvmlEnableState_t;

typedef enum { NVML_TEMPERATURE_GPU = 0 } nvmlTemperatureSensors_t;

typedef enum {
  NVML_CLOCK_GRAPHICS = 0,
  NVML_CLOCK_SM = 1,
  NVML_CLOCK_MEM = 2,
  NVML_CLOCK_VIDEO = 3,
} nvmlClockType_t;

typedef enum {
  NVML_MEMORY_ERROR_TYPE_CORRECTED = 0,
  NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1,
} nvmlMemoryErrorType_t;

typedef enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 } nvmlEccCounterType_t;

typedef enum {
  NVML_COMPUTEMODE_DEFAULT = 0,
  NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1,
  NVML_COMPUTEMODE_PROHIBITED = 2,
  NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3,
} nvmlComputeMode_t;

// Event type bits (nvmlDeviceRegisterEvents).
enum : unsigned long long {
  nvmlEventTypeSingleBitEccError = 0x1ULL,
  nvmlEventTypeDoubleBitEccError = 0x2ULL,
  nvmlEventTypePState = 0x4ULL,
  nvmlEventTypeXidCriticalError = 0x8ULL,
  nvmlEventTypeClock = 0x10ULL,
  nvmlEventTypeMigConfigChange = 0x100ULL,
};

enum : unsigned int { NVML_DEVICE_MIG_DISABLE = 0, NVML_DEVICE_MIG_ENABLE = 1 };

// What the far end of an NVLink is (nvmlDeviceGetNvLinkRemoteDeviceType).
typedef enum {
  NVML_NVLINK_DEVICE_TYPE_GPU = 0x00,
  NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01,
  NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02,
  NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF,
} nvmlIntNvLinkDeviceType_t;

// Multi-Instance GPU management (nvmlDeviceSetMigMode, GPU and compute instances).
typedef struct nvmlGpuInstance_st* nvmlGpuInstance_t;
typedef struct nvmlComputeInstance_st* nvmlComputeInstance_t;

// GPU instance profile ids (the index passed to nvmlDeviceGetGpuInstanceProfileInfo).
enum : unsigned int {
  NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0,
  NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1,
  NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2,
  NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3,
  NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4,
  NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5,
  NVML_GPU_INSTANCE_PROFILE_6_SLICE = 0x6,
  NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7,
  NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8,
  NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9,
  NVML_GPU_INSTANCE_PROFILE_COUNT = 0xA,
};

// Compute instance profile ids, and the only engine profile (engines shared within the GI).
enum : unsigned int {
  NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0,
  NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1,
  NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2,
  NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3,
  NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4,
  NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE = 0x5,
  NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE = 0x6,
  NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7,
  NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x8,
  NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0,
};

// A GPU instance's position in units of memory slices (8 on A100/H100/H200).
typedef struct {
  unsigned int start;
  unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef struct {
  unsigned int id;  // an NVML_GPU_INSTANCE_PROFILE_* value
  unsigned int isP2pSupported;
  unsigned int sliceCount;
  unsigned int instanceCount;  // how many instances of this profile fit on an empty GPU
  unsigned int multiprocessorCount;
  unsigned int copyEngineCount;
  unsigned int decoderCount;
  unsigned int encoderCount;
  unsigned int jpegCount;
  unsigned int ofaCount;
  unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
  nvmlDevice_t device;
  unsigned int id;
  unsigned int profileId;
  nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
  unsigned int start;
  unsigned int size;
} nvmlComputeInstancePlacement_t;

typedef struct {
  unsigned int id;  // an NVML_COMPUTE_INSTANCE_PROFILE_* value
  unsigned int sliceCount;
  unsigned int instanceCount;
  unsigned int multiprocessorCount;
  unsigned int sharedCopyEngineCount;
  unsigned int sharedDecoderCount;
  unsigned int sharedEncoderCount;
  unsigned int sharedJpegCount;
  unsigned int sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
  nvmlDevice_t device;
  nvmlGpuInstance_t gpuInstance;
  unsigned int id;
  unsigned int profileId;
  nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

}  // extern "C"

// Field values (nvmlDeviceGetFieldValues): readings addressed by field id, e.g. memory temperature.
enum : unsigned int {
  NVML_FI_DEV_MEMORY_TEMP = 82,
  NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX = 140,  // KiB, data + protocol overhead, all links
  NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX = 141,
};
// scopeId asking for the sum over every NVLink.
inline constexpr unsigned int kNvmlScopeAllLinks = 0xFFFFFFFFu;

typedef enum {
  NVML_VALUE_TYPE_DOUBLE = 0,
  NVML_VALUE_TYPE_UNSIGNED_INT = 1,
  NVML_VALUE_TYPE_UNSIGNED_LONG = 2,
  NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3,
  NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4,
  NVML_VALUE_TYPE_SIGNED_INT = 5,
} nvmlValueType_t;

typedef union {
  double dVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
  signed int siVal;
} nvmlValue_t;

typedef struct {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  nvmlValueType_t valueType;
  nvmlReturn_t nvmlReturn;
  nvmlValue_t value;
} nvmlFieldValue_t;

// nvmlDeviceGetMemoryInfo_v2: like nvmlMemory_t plus the memory the driver reserves.
typedef struct {
  unsigned int version;  // nvmlMemory_v2 below
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_v2_t;
inline constexpr unsigned int nvmlMemory_v2 =
    static_cast<unsigned int>(sizeof(nvmlMemory_v2_t)) | (2u << 24);

// GPU Performance Monitoring (Hopper and newer): two samples taken some time apart give the
// averages of profiling metrics over the interval.
typedef struct nvmlGpmSample_st* nvmlGpmSample_t;

enum : unsigned int {
  NVML_GPM_METRIC_GRAPHICS_UTIL = 1,
  NVML_GPM_METRIC_SM_UTIL = 2,
  NVML_GPM_METRIC_SM_OCCUPANCY = 3,
  NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5,
  NVML_GPM_METRIC_DRAM_BW_UTIL = 10,
  NVML_GPM_METRIC_FP64_UTIL = 11,
  NVML_GPM_METRIC_FP32_UTIL = 12,
  NVML_GPM_METRIC_FP16_UTIL = 13,
  NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20,  // MiB/s
  NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21,
  NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60,
  NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61,
};
inline constexpr unsigned int NVML_GPM_METRICS_GET_VERSION = 1;
inline constexpr unsigned int NVML_GPM_SUPPORT_VERSION = 1;
// Capacity of the metrics array. The driver reads and writes only the first numMetrics entries,
// so the capacity is ours to choose; it matches the largest NVML_GPM_METRIC_MAX published.
inline constexpr unsigned int kNvmlGpmMetricsCapacity = 333;

typedef struct {
  unsigned int metricId;
  nvmlReturn_t nvmlReturn;
  double value;
  struct {
    char* shortName;
    char* longName;
    char* unit;
  } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
  unsigned int version;  // NVML_GPM_METRICS_GET_VERSION
  unsigned int numMetrics;
  nvmlGpmSample_t sample1;
  nvmlGpmSample_t sample2;
  nvmlGpmMetric_t metrics[kNvmlGpmMetricsCapacity];
} nvmlGpmMetricsGet_t;

typedef struct {
  unsigned int version;  // NVML_GPM_SUPPORT_VERSION
  unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

// Per-process data (nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetProcessUtilization),
// for attributing a shared GPU's use to the pods whose processes run on it.
// usedGpuMemory is NVML_VALUE_NOT_AVAILABLE (all ones) when the driver cannot tell; on a GPU with
// MIG enabled the parent's list carries each process's GPU and compute instance ids (all ones
// otherwise).
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;  // bytes
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlProcessInfo_t;
inline constexpr unsigned long long kNvmlValueNotAvailableUll = ~0ULL;

// One utilisation sample of a process, over the driver's sample period ending at timeStamp.
typedef struct {
  unsigned int pid;
  unsigned long long timeStamp;  // CPU time, microseconds
  unsigned int smUtil;           // percent
  unsigned int memUtil;          // percent
  unsigned int encUtil;
  unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

// The functions gpulet resolves, as X(name, return type, parameter list). Required ones fail the
// load when absent; optional ones are left null and their features report "not supported".
#define GPULET_NVML_REQUIRED_FUNCTIONS(X)                                                      \
  X(nvmlInit_v2, nvmlReturn_t, (void))                                                         \
  X(nvmlShutdown, nvmlReturn_t, (void))                                                        \
  X(nvmlErrorString, const char*, (nvmlReturn_t result))                                       \
  X(nvmlSystemGetDriverVersion, nvmlReturn_t, (char* version, unsigned int length))            \
  X(nvmlDeviceGetCount_v2, nvmlReturn_t, (unsigned int* count))                                \
  X(nvmlDeviceGetHandleByIndex_v2, nvmlReturn_t, (unsigned int index, nvmlDevice_t* device))   \
  X(nvmlDeviceGetUUID, nvmlReturn_t, (nvmlDevice_t device, char* uuid, unsigned int length))   \
  X(nvmlDeviceGetName, nvmlReturn_t, (nvmlDevice_t device, char* name, unsigned int length))   \
  X(nvmlDeviceGetMemoryInfo, nvmlReturn_t, (nvmlDevice_t device, nvmlMemory_t * memory))       \
  X(nvmlDeviceGetPciInfo_v3, nvmlReturn_t, (nvmlDevice_t device, nvmlPciInfo_t * pci))         \
  X(nvmlDeviceGetMinorNumber, nvmlReturn_t, (nvmlDevice_t device, unsigned int* minor))        \
  X(nvmlDeviceGetCudaComputeCapability, nvmlReturn_t,                                          \
    (nvmlDevice_t device, int* major, int* minor))                                             \
  X(nvmlEventSetCreate, nvmlReturn_t, (nvmlEventSet_t * set))                                  \
  X(nvmlDeviceRegisterEvents, nvmlReturn_t,                                                    \
    (nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set))                  \
  X(nvmlEventSetWait_v2, nvmlReturn_t,                                                         \
    (nvmlEventSet_t set, nvmlEventData_t * data, unsigned int timeoutms))                      \
  X(nvmlEventSetFree, nvmlReturn_t, (nvmlEventSet_t set))

// nvmlGpuletSimulated is not NVML: only gpulet's simulated driver exports it (returning 1), so
// every layer can tell, and say loudly, that the GPUs it serves are not real.
#define GPULET_NVML_OPTIONAL_FUNCTIONS(X)                                                      \
  X(nvmlGpuletSimulated, int, (void))                                                          \
  X(nvmlSystemGetCudaDriverVersion_v2, nvmlReturn_t, (int* version))                           \
  X(nvmlDeviceGetArchitecture, nvmlReturn_t,                                                   \
    (nvmlDevice_t device, nvmlDeviceArchitecture_t * arch))                                    \
  X(nvmlDeviceGetMigMode, nvmlReturn_t,                                                        \
    (nvmlDevice_t device, unsigned int* current, unsigned int* pending))                       \
  X(nvmlDeviceGetMaxMigDeviceCount, nvmlReturn_t, (nvmlDevice_t device, unsigned int* count))  \
  X(nvmlDeviceGetMigDeviceHandleByIndex, nvmlReturn_t,                                         \
    (nvmlDevice_t device, unsigned int index, nvmlDevice_t* mig))                              \
  X(nvmlDeviceGetGpuInstanceId, nvmlReturn_t, (nvmlDevice_t device, unsigned int* id))         \
  X(nvmlDeviceGetComputeInstanceId, nvmlReturn_t, (nvmlDevice_t device, unsigned int* id))     \
  X(nvmlDeviceGetAttributes_v2, nvmlReturn_t,                                                  \
    (nvmlDevice_t device, nvmlDeviceAttributes_t * attributes))                                \
  X(nvmlDeviceGetTopologyCommonAncestor, nvmlReturn_t,                                         \
    (nvmlDevice_t a, nvmlDevice_t b, nvmlGpuTopologyLevel_t * level))                          \
  X(nvmlDeviceGetNvLinkState, nvmlReturn_t,                                                    \
    (nvmlDevice_t device, unsigned int link, nvmlEnableState_t * active))                      \
  X(nvmlDeviceGetNvLinkRemotePciInfo_v2, nvmlReturn_t,                                         \
    (nvmlDevice_t device, unsigned int link, nvmlPciInfo_t * pci))                             \
  X(nvmlDeviceGetNvLinkRemoteDeviceType, nvmlReturn_t,                                         \
    (nvmlDevice_t device, unsigned int link, nvmlIntNvLinkDeviceType_t * type))                \
  X(nvmlDeviceGetTemperature, nvmlReturn_t,                                                    \
    (nvmlDevice_t device, nvmlTemperatureSensors_t sensor, unsigned int* temp))                \
  X(nvmlDeviceGetUtilizationRates, nvmlReturn_t,                                               \
    (nvmlDevice_t device, nvmlUtilization_t * utilization))                                    \
  X(nvmlDeviceGetPowerUsage, nvmlReturn_t, (nvmlDevice_t device, unsigned int* milliwatts))    \
  X(nvmlDeviceGetTotalEnergyConsumption, nvmlReturn_t,                                         \
    (nvmlDevice_t device, unsigned long long* millijoules))                                    \
  X(nvmlDeviceGetClockInfo, nvmlReturn_t,                                                      \
    (nvmlDevice_t device, nvmlClockType_t type, unsigned int* mhz))                            \
  X(nvmlDeviceGetTotalEccErrors, nvmlReturn_t,                                                 \
    (nvmlDevice_t device, nvmlMemoryErrorType_t errorType, nvmlEccCounterType_t counterType,   \
     unsigned long long* count))                                                               \
  X(nvmlDeviceGetComputeMode, nvmlReturn_t, (nvmlDevice_t device, nvmlComputeMode_t * mode))   \
  X(nvmlDeviceSetComputeMode, nvmlReturn_t, (nvmlDevice_t device, nvmlComputeMode_t mode))     \
  X(nvmlDeviceGetPcieReplayCounter, nvmlReturn_t, (nvmlDevice_t device, unsigned int* value))  \
  X(nvmlDeviceGetEncoderUtilization, nvmlReturn_t,                                             \
    (nvmlDevice_t device, unsigned int* utilization, unsigned int* sampling_period_us))        \
  X(nvmlDeviceGetDecoderUtilization, nvmlReturn_t,                                             \
    (nvmlDevice_t device, unsigned int* utilization, unsigned int* sampling_period_us))        \
  X(nvmlDeviceGetRemappedRows, nvmlReturn_t,                                                   \
    (nvmlDevice_t device, unsigned int* corr_rows, unsigned int* unc_rows,                     \
     unsigned int* is_pending, unsigned int* failure_occurred))                                \
  X(nvmlDeviceGetCurrentClocksThrottleReasons, nvmlReturn_t,                                   \
    (nvmlDevice_t device, unsigned long long* reasons))                                        \
  X(nvmlDeviceSetMigMode, nvmlReturn_t,                                                        \
    (nvmlDevice_t device, unsigned int mode, nvmlReturn_t* activationStatus))                  \
  X(nvmlDeviceGetGpuInstanceProfileInfo, nvmlReturn_t,                                         \
    (nvmlDevice_t device, unsigned int profile, nvmlGpuInstanceProfileInfo_t* info))           \
  X(nvmlDeviceGetGpuInstancePossiblePlacements_v2, nvmlReturn_t,                               \
    (nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t* placements,      \
     unsigned int* count))                                                                     \
  X(nvmlDeviceCreateGpuInstanceWithPlacement, nvmlReturn_t,                                    \
    (nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t* placement, \
     nvmlGpuInstance_t* gpuInstance))                                                          \
  X(nvmlDeviceGetGpuInstances, nvmlReturn_t,                                                   \
    (nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t* gpuInstances,             \
     unsigned int* count))                                                                     \
  X(nvmlGpuInstanceGetInfo, nvmlReturn_t,                                                      \
    (nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t* info))                              \
  X(nvmlGpuInstanceDestroy, nvmlReturn_t, (nvmlGpuInstance_t gpuInstance))                     \
  X(nvmlGpuInstanceGetComputeInstanceProfileInfo, nvmlReturn_t,                                \
    (nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,             \
     nvmlComputeInstanceProfileInfo_t* info))                                                  \
  X(nvmlGpuInstanceCreateComputeInstance, nvmlReturn_t,                                        \
    (nvmlGpuInstance_t gpuInstance, unsigned int profileId,                                    \
     nvmlComputeInstance_t* computeInstance))                                                  \
  X(nvmlGpuInstanceGetComputeInstances, nvmlReturn_t,                                          \
    (nvmlGpuInstance_t gpuInstance, unsigned int profileId,                                    \
     nvmlComputeInstance_t* computeInstances, unsigned int* count))                            \
  X(nvmlComputeInstanceDestroy, nvmlReturn_t, (nvmlComputeInstance_t computeInstance))         \
  X(nvmlComputeInstanceGetInfo_v2, nvmlReturn_t,                                               \
    (nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t* info))

// Telemetry beyond the basic queries: field values, memory v2 and GPM profiling.
#define GPULET_NVML_TELEMETRY_FUNCTIONS(X)                                                     \
  X(nvmlDeviceGetFieldValues, nvmlReturn_t,                                                    \
    (nvmlDevice_t device, int valuesCount, nvmlFieldValue_t* values))                          \
  X(nvmlDeviceGetMemoryInfo_v2, nvmlReturn_t, (nvmlDevice_t device, nvmlMemory_v2_t* memory))  \
  X(nvmlGpmQueryDeviceSupport, nvmlReturn_t, (nvmlDevice_t device, nvmlGpmSupport_t* support)) \
  X(nvmlGpmSampleAlloc, nvmlReturn_t, (nvmlGpmSample_t * sample))                              \
  X(nvmlGpmSampleFree, nvmlReturn_t, (nvmlGpmSample_t sample))                                 \
  X(nvmlGpmSampleGet, nvmlReturn_t, (nvmlDevice_t device, nvmlGpmSample_t sample))             \
  X(nvmlGpmMigSampleGet, nvmlReturn_t,                                                         \
    (nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t sample))                 \
  X(nvmlGpmMetricsGet, nvmlReturn_t, (nvmlGpmMetricsGet_t * metricsGet))

// Per-process data. Both follow NVML's two-call protocol: *count in = capacity of the array, out
// = entries written; NVML_ERROR_INSUFFICIENT_SIZE with *count = the entries needed when the
// array is too small (or null). nvmlDeviceGetProcessUtilization returns the samples newer than
// lastSeenTimeStamp (0: every sample in the driver's buffer) and NVML_ERROR_NOT_FOUND when there
// are none.
#define GPULET_NVML_PROCESS_FUNCTIONS(X)                                                       \
  X(nvmlDeviceGetComputeRunningProcesses_v3, nvmlReturn_t,                                     \
    (nvmlDevice_t device, unsigned int* infoCount, nvmlProcessInfo_t* infos))                  \
  X(nvmlDeviceGetProcessUtilization, nvmlReturn_t,                                             \
    (nvmlDevice_t device, nvmlProcessUtilizationSample_t* utilization,                         \
     unsigned int* processSamplesCount, unsigned long long lastSeenTimeStamp))

#define GPULET_NVML_ALL_FUNCTIONS(X) \
  GPULET_NVML_REQUIRED_FUNCTIONS(X)  \
  GPULET_NVML_OPTIONAL_FUNCTIONS(X)  \
  GPULET_NVML_TELEMETRY_FUNCTIONS(X) \
  GPULET_NVML_PROCESS_FUNCTIONS(X)
