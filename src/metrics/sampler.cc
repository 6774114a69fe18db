#include "metrics/sampler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <utility>

namespace gpulet::metrics {

void XidLog::Record(unsigned gpu, uint64_t xid) {
  Record(gpu, xid, std::chrono::steady_clock::now());
}

void XidLog::Record(unsigned gpu, uint64_t xid, TimePoint at) {
  std::lock_guard lock(mu_);
  last_[gpu] = xid;
  auto& events = events_[gpu];
  events.emplace_back(at, xid);
  while (events.size() > kMaxEventsPerGpu) events.pop_front();
}

void XidLog::SetCountWindow(std::chrono::milliseconds window) {
  std::lock_guard lock(mu_);
  window_ = window;
}

std::map<uint64_t, int64_t> XidLog::CountsInWindow(unsigned gpu) const {
  return CountsInWindow(gpu, std::chrono::steady_clock::now());
}

std::map<uint64_t, int64_t> XidLog::CountsInWindow(unsigned gpu, TimePoint now) const {
  std::lock_guard lock(mu_);
  std::map<uint64_t, int64_t> out;
  auto it = events_.find(gpu);
  if (it == events_.end()) return out;
  for (const auto& [at, xid] : it->second) {
    if (at > now - window_ && at <= now) ++out[xid];
  }
  return out;
}

uint64_t XidLog::Last(unsigned gpu) const {
  std::lock_guard lock(mu_);
  auto it = last_.find(gpu);
  return it == last_.end() ? 0 : it->second;
}

namespace {

constexpr uint64_t kMiB = 1024ull * 1024ull;
// The shortest interval worth averaging GPM counters over (the first collection only).
constexpr std::chrono::milliseconds kGpmPrimeInterval{100};

// The outcome of reading one field: a value, "not available here", or "the GPU is lost".
struct Reading {
  std::optional<Value> value;
  nvmlReturn_t rc = NVML_SUCCESS;
};

// The GPM metric behind a profiling source, and the factor from NVML's unit to DCGM's (percent →
// ratio, MiB/s → bytes/s).
std::pair<unsigned, double> GpmMetric(Source s) {
  constexpr double kPercent = 0.01;
  constexpr double kMiBps = 1024.0 * 1024.0;
  switch (s) {
    case Source::kProfGrEngineActive:
      return {NVML_GPM_METRIC_GRAPHICS_UTIL, kPercent};
    case Source::kProfSmActive:
      return {NVML_GPM_METRIC_SM_UTIL, kPercent};
    case Source::kProfSmOccupancy:
      return {NVML_GPM_METRIC_SM_OCCUPANCY, kPercent};
    case Source::kProfTensorActive:
      return {NVML_GPM_METRIC_ANY_TENSOR_UTIL, kPercent};
    case Source::kProfDramActive:
      return {NVML_GPM_METRIC_DRAM_BW_UTIL, kPercent};
    case Source::kProfFp64Active:
      return {NVML_GPM_METRIC_FP64_UTIL, kPercent};
    case Source::kProfFp32Active:
      return {NVML_GPM_METRIC_FP32_UTIL, kPercent};
    case Source::kProfFp16Active:
      return {NVML_GPM_METRIC_FP16_UTIL, kPercent};
    case Source::kProfPcieTxBytes:
      return {NVML_GPM_METRIC_PCIE_TX_PER_SEC, kMiBps};
    case Source::kProfPcieRxBytes:
      return {NVML_GPM_METRIC_PCIE_RX_PER_SEC, kMiBps};
    case Source::kProfNvlinkTxBytes:
      return {NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, kMiBps};
    case Source::kProfNvlinkRxBytes:
      return {NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, kMiBps};
    default:
      return {0, 0};
  }
}

// A field value as a double, whatever type NVML chose for it.
double FieldValueAsDouble(const nvmlFieldValue_t& v) {
  switch (v.valueType) {
    case NVML_VALUE_TYPE_DOUBLE:
      return v.value.dVal;
    case NVML_VALUE_TYPE_UNSIGNED_INT:
      return v.value.uiVal;
    case NVML_VALUE_TYPE_UNSIGNED_LONG:
      return static_cast<double>(v.value.ulVal);
    case NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
      return static_cast<double>(v.value.ullVal);
    case NVML_VALUE_TYPE_SIGNED_LONG_LONG:
      return static_cast<double>(v.value.sllVal);
    case NVML_VALUE_TYPE_SIGNED_INT:
      return v.value.siVal;
  }
  return 0;
}

// Memoises the NVML queries of one entity for one collection.
class EntityReader {
 public:
  EntityReader(const gpu::NvmlFunctions& fn, nvmlDevice_t dev) : fn_(fn), dev_(dev) {}

  Reading Read(Source source, uint64_t last_xid) {
    switch (source) {
      case Source::kSmClock:
        return Clock(NVML_CLOCK_SM);
      case Source::kMemClock:
        return Clock(NVML_CLOCK_MEM);
      case Source::kGpuTemp: {
        if (!fn_.nvmlDeviceGetTemperature) return Unsupported();
        unsigned t = 0;
        nvmlReturn_t rc = fn_.nvmlDeviceGetTemperature(dev_, NVML_TEMPERATURE_GPU, &t);
        return IntResult(rc, t);
      }
      case Source::kPowerUsage: {
        if (!fn_.nvmlDeviceGetPowerUsage) return Unsupported();
        unsigned mw = 0;
        nvmlReturn_t rc = fn_.nvmlDeviceGetPowerUsage(dev_, &mw);
        if (rc != NVML_SUCCESS) return {std::nullopt, rc};
        return {Value::Double(mw / 1000.0), rc};
      }
      case Source::kTotalEnergy: {
        if (!fn_.nvmlDeviceGetTotalEnergyConsumption) return Unsupported();
        unsigned long long mj = 0;
        nvmlReturn_t rc = fn_.nvmlDeviceGetTotalEnergyConsumption(dev_, &mj);
        return IntResult(rc, mj);
      }
      case Source::kPcieReplay: {
        if (!fn_.nvmlDeviceGetPcieReplayCounter) return Unsupported();
        unsigned v = 0;
        nvmlReturn_t rc = fn_.nvmlDeviceGetPcieReplayCounter(dev_, &v);
        return IntResult(rc, v);
      }
      case Source::kGpuUtil:
      case Source::kMemCopyUtil: {
        if (!util_) {
          util_.emplace();
          util_rc_ = fn_.nvmlDeviceGetUtilizationRates
                         ? fn_.nvmlDeviceGetUtilizationRates(dev_, &*util_)
                         : NVML_ERROR_FUNCTION_NOT_FOUND;
        }
        return IntResult(util_rc_, source == Source::kGpuUtil ? util_->gpu : util_->memory);
      }
      case Source::kEncUtil:
      case Source::kDecUtil: {
        auto f = source == Source::kEncUtil ? fn_.nvmlDeviceGetEncoderUtilization
                                            : fn_.nvmlDeviceGetDecoderUtilization;
        if (!f) return Unsupported();
        unsigned u = 0, period = 0;
        nvmlReturn_t rc = f(dev_, &u, &period);
        return IntResult(rc, u);
      }
      case Source::kXid:
        return {Value::Int(static_cast<int64_t>(last_xid)), NVML_SUCCESS};
      case Source::kXidCount:  // filled by Sample() from the XidLog
        return {std::nullopt, NVML_SUCCESS};
      case Source::kFbFree:
      case Source::kFbUsed:
      case Source::kFbTotal: {
        // DCGM's meaning: used + free + reserved = total. The v2 call reports the driver's
        // reserved memory apart from used; v1 (older drivers) has no reserved figure.
        if (fn_.nvmlDeviceGetMemoryInfo_v2 && ReadMemoryV2() == NVML_SUCCESS) {
          unsigned long long b = source == Source::kFbFree   ? mem2_->free
                                 : source == Source::kFbUsed ? mem2_->used
                                                             : mem2_->total;
          return IntResult(NVML_SUCCESS, b / kMiB);
        }
        if (!mem_) {
          mem_.emplace();
          mem_rc_ = fn_.nvmlDeviceGetMemoryInfo(dev_, &*mem_);
        }
        unsigned long long b = source == Source::kFbFree   ? mem_->free
                               : source == Source::kFbUsed ? mem_->used
                                                           : mem_->total;
        return IntResult(mem_rc_, b / kMiB);
      }
      case Source::kEccSbeVolatile:
        return Ecc(NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC);
      case Source::kEccDbeVolatile:
        return Ecc(NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC);
      case Source::kEccSbeAggregate:
        return Ecc(NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC);
      case Source::kEccDbeAggregate:
        return Ecc(NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC);
      case Source::kCorrRemappedRows:
      case Source::kUncorrRemappedRows:
      case Source::kRowRemapPending:
      case Source::kRowRemapFailure: {
        if (!fn_.nvmlDeviceGetRemappedRows) return Unsupported();
        if (!rows_) {
          rows_.emplace();
          rows_rc_ = fn_.nvmlDeviceGetRemappedRows(dev_, &(*rows_)[0], &(*rows_)[1], &(*rows_)[2],
                                                   &(*rows_)[3]);
        }
        int i = source == Source::kCorrRemappedRows     ? 0
                : source == Source::kUncorrRemappedRows ? 1
                : source == Source::kRowRemapPending    ? 2
                                                        : 3;
        return IntResult(rows_rc_, (*rows_)[i]);
      }
      case Source::kThrottleReasons: {
        if (!fn_.nvmlDeviceGetCurrentClocksThrottleReasons) return Unsupported();
        unsigned long long r = 0;
        nvmlReturn_t rc = fn_.nvmlDeviceGetCurrentClocksThrottleReasons(dev_, &r);
        return IntResult(rc, r);
      }
      case Source::kMemoryTemp: {
        nvmlFieldValue_t v{};
        v.fieldId = NVML_FI_DEV_MEMORY_TEMP;
        nvmlReturn_t rc = Fields(&v, 1);
        return IntResult(rc, static_cast<int64_t>(FieldValueAsDouble(v)));
      }
      case Source::kNvlinkBandwidth: {
        nvmlFieldValue_t v[2]{};
        v[0].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX;
        v[1].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX;
        v[0].scopeId = v[1].scopeId = kNvmlScopeAllLinks;
        nvmlReturn_t rc = Fields(v, 2);
        const double kib = FieldValueAsDouble(v[0]) + FieldValueAsDouble(v[1]);
        return IntResult(rc, static_cast<int64_t>(kib * 1024.0));
      }
      case Source::kFbReserved: {
        if (!fn_.nvmlDeviceGetMemoryInfo_v2) return Unsupported();
        const nvmlReturn_t rc = ReadMemoryV2();
        return IntResult(rc, rc == NVML_SUCCESS ? mem2_->reserved / kMiB : 0);
      }
      default:
        return Unsupported();
    }
  }

 private:
  static Reading Unsupported() { return {std::nullopt, NVML_ERROR_FUNCTION_NOT_FOUND}; }
  template <typename T>
  static Reading IntResult(nvmlReturn_t rc, T v) {
    if (rc != NVML_SUCCESS) return {std::nullopt, rc};
    return {Value::Int(static_cast<int64_t>(v)), rc};
  }
  Reading Clock(nvmlClockType_t type) {
    if (!fn_.nvmlDeviceGetClockInfo) return Unsupported();
    unsigned mhz = 0;
    nvmlReturn_t rc = fn_.nvmlDeviceGetClockInfo(dev_, type, &mhz);
    return IntResult(rc, mhz);
  }
  // Reads `n` field values; the first failing value's status is the result.
  nvmlReturn_t Fields(nvmlFieldValue_t* values, int n) {
    if (!fn_.nvmlDeviceGetFieldValues) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = fn_.nvmlDeviceGetFieldValues(dev_, n, values);
    for (int i = 0; rc == NVML_SUCCESS && i < n; ++i) rc = values[i].nvmlReturn;
    return rc;
  }
  Reading Ecc(nvmlMemoryErrorType_t type, nvmlEccCounterType_t counter) {
    if (!fn_.nvmlDeviceGetTotalEccErrors) return Unsupported();
    unsigned long long n = 0;
    nvmlReturn_t rc = fn_.nvmlDeviceGetTotalEccErrors(dev_, type, counter, &n);
    return IntResult(rc, n);
  }

  const gpu::NvmlFunctions& fn_;
  nvmlDevice_t dev_;
  std::optional<nvmlUtilization_t> util_;
  nvmlReturn_t util_rc_ = NVML_SUCCESS;
  // One v2 read per entity and collection, shared by the four framebuffer fields.
  nvmlReturn_t ReadMemoryV2() {
    if (!mem2_) {
      mem2_.emplace();
      mem2_->version = nvmlMemory_v2;
      mem2_rc_ = fn_.nvmlDeviceGetMemoryInfo_v2(dev_, &*mem2_);
    }
    return mem2_rc_;
  }

  std::optional<nvmlMemory_t> mem_;
  nvmlReturn_t mem_rc_ = NVML_SUCCESS;
  std::optional<nvmlMemory_v2_t> mem2_;
  nvmlReturn_t mem2_rc_ = NVML_SUCCESS;
  std::optional<std::array<unsigned, 4>> rows_;
  nvmlReturn_t rows_rc_ = NVML_SUCCESS;
};

bool IsLost(nvmlReturn_t rc) {
  return rc == NVML_ERROR_GPU_IS_LOST || rc == NVML_ERROR_GPU_NOT_FOUND;
}

std::string LabelValue(Source s, const gpu::Inventory& inv, const gpu::Gpu& g) {
  switch (s) {
    case Source::kDriverVersion:
      return inv.driver_version;
    case Source::kCudaDriverVersion:
      return inv.cuda_version;
    case Source::kDeviceName:
      return g.name;
    case Source::kDeviceUuid:
      return g.uuid;
    case Source::kPciBusId:
      return g.pci_bus_id;
    default:
      return "";
  }
}

Reading GpmReading(const GpmReadings& gpm, Source source) {
  if (gpm.warming) return {std::nullopt, NVML_SUCCESS};
  if (gpm.rc != NVML_SUCCESS) return {std::nullopt, gpm.rc};
  const auto [id, scale] = GpmMetric(source);
  auto it = gpm.values.find(id);
  if (it == gpm.values.end()) return {std::nullopt, NVML_ERROR_NOT_SUPPORTED};
  const double v = it->second * scale;
  // Ratios are DCGM doubles; byte rates are DCGM integers.
  if (scale < 1.0) return {Value::Double(v), NVML_SUCCESS};
  return {Value::Int(static_cast<int64_t>(v)), NVML_SUCCESS};
}

}  // namespace

Sampler::~Sampler() {
  for (auto& [key, st] : gpm_) {
    if (fn_.nvmlGpmSampleFree == nullptr) break;
    if (st.prev != nullptr) fn_.nvmlGpmSampleFree(st.prev);
    if (st.next != nullptr) fn_.nvmlGpmSampleFree(st.next);
  }
}

bool Sampler::GpmSupported(nvmlDevice_t parent, const gpu::Gpu& g, nvmlReturn_t* rc) {
  auto supported = gpm_supported_.find(g.index);
  if (supported == gpm_supported_.end()) {
    nvmlGpmSupport_t support{};
    support.version = NVML_GPM_SUPPORT_VERSION;
    nvmlReturn_t q = fn_.nvmlGpmQueryDeviceSupport ? fn_.nvmlGpmQueryDeviceSupport(parent, &support)
                                                   : NVML_ERROR_FUNCTION_NOT_FOUND;
    if (IsLost(q)) {  // asked again next time
      *rc = q;
      return false;
    }
    supported =
        gpm_supported_.emplace(g.index, q == NVML_SUCCESS && support.isSupportedDevice).first;
  }
  if (!supported->second) *rc = NVML_ERROR_NOT_SUPPORTED;
  return supported->second;
}

nvmlReturn_t Sampler::TakeGpmSample(nvmlDevice_t parent, const EntityKey& key,
                                    nvmlGpmSample_t sample) {
  if (key.gpu_instance_id < 0) return fn_.nvmlGpmSampleGet(parent, sample);
  if (!fn_.nvmlGpmMigSampleGet) return NVML_ERROR_FUNCTION_NOT_FOUND;
  return fn_.nvmlGpmMigSampleGet(parent, static_cast<unsigned>(key.gpu_instance_id), sample);
}

void Sampler::PrimeGpm() {
  if (!fn_.nvmlGpmSampleAlloc || !fn_.nvmlGpmSampleGet || !fn_.nvmlGpmSampleFree) return;
  bool primed = false;
  for (const gpu::Gpu& g : inventory_.gpus) {
    nvmlDevice_t dev = Handle(g.index);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (dev == nullptr || !GpmSupported(dev, g, &rc)) continue;
    std::vector<EntityKey> keys;
    if (g.mig_enabled && !g.mig_devices.empty()) {
      for (const gpu::MigDevice& m : g.mig_devices) {
        EntityKey k{g.index, static_cast<int>(m.gpu_instance_id)};
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
      }
    } else {
      keys.push_back({g.index, -1});
    }
    for (const EntityKey& k : keys) {
      GpmState& st = gpm_[k];
      if (st.have_prev) continue;
      if (st.prev == nullptr && fn_.nvmlGpmSampleAlloc(&st.prev) != NVML_SUCCESS) {
        st.prev = nullptr;
        continue;
      }
      st.have_prev = TakeGpmSample(dev, k, st.prev) == NVML_SUCCESS;
      primed = primed || st.have_prev;
    }
  }
  if (primed) std::this_thread::sleep_for(kGpmPrimeInterval);
}

GpmReadings Sampler::ReadGpm(nvmlDevice_t parent, const gpu::Gpu& g, const EntityKey& key,
                             const std::vector<unsigned>& metric_ids) {
  GpmReadings r;
  if (!fn_.nvmlGpmSampleAlloc || !fn_.nvmlGpmSampleGet || !fn_.nvmlGpmMetricsGet ||
      !fn_.nvmlGpmSampleFree) {
    r.rc = NVML_ERROR_FUNCTION_NOT_FOUND;
    return r;
  }
  if (!GpmSupported(parent, g, &r.rc)) return r;
  GpmState& st = gpm_[key];
  for (nvmlGpmSample_t* s : {&st.prev, &st.next}) {
    if (*s == nullptr && fn_.nvmlGpmSampleAlloc(s) != NVML_SUCCESS) {
      *s = nullptr;
      r.rc = NVML_ERROR_MEMORY;
      return r;
    }
  }
  nvmlReturn_t rc = TakeGpmSample(parent, key, st.next);
  if (rc != NVML_SUCCESS) {
    st.have_prev = false;
    r.rc = rc;
    return r;
  }
  if (!st.have_prev) {
    std::swap(st.prev, st.next);
    st.have_prev = true;
    r.warming = true;
    return r;
  }
  if (!gpm_request_) gpm_request_ = std::make_unique<nvmlGpmMetricsGet_t>();
  nvmlGpmMetricsGet_t& req = *gpm_request_;
  req = nvmlGpmMetricsGet_t{};
  req.version = NVML_GPM_METRICS_GET_VERSION;
  req.numMetrics =
      static_cast<unsigned>(std::min<size_t>(metric_ids.size(), kNvmlGpmMetricsCapacity));
  req.sample1 = st.prev;
  req.sample2 = st.next;
  for (unsigned i = 0; i < req.numMetrics; ++i) req.metrics[i].metricId = metric_ids[i];
  rc = fn_.nvmlGpmMetricsGet(&req);
  std::swap(st.prev, st.next);  // this sample is the start of the next interval
  if (rc != NVML_SUCCESS) {
    r.rc = rc;
    return r;
  }
  for (unsigned i = 0; i < req.numMetrics; ++i) {
    if (req.metrics[i].nvmlReturn == NVML_SUCCESS) {
      r.values[req.metrics[i].metricId] = req.metrics[i].value;
    }
  }
  return r;
}

Sampler::Sampler(const gpu::NvmlFunctions& fn, gpu::Inventory inventory, std::string hostname,
                 const XidLog* xids)
    : fn_(fn), inventory_(std::move(inventory)), hostname_(std::move(hostname)), xids_(xids) {
  handles_.assign(inventory_.gpus.size(), nullptr);
}

nvmlDevice_t Sampler::Handle(unsigned index) {
  if (index >= handles_.size()) return nullptr;
  if (handles_[index] == nullptr) {
    nvmlDevice_t h = nullptr;
    if (fn_.nvmlDeviceGetHandleByIndex_v2(index, &h) == NVML_SUCCESS) handles_[index] = h;
  }
  return handles_[index];
}

Snapshot Sampler::Sample(std::shared_ptr<const CounterSet> counters) {
  Snapshot snap;
  snap.counters = counters;
  snap.hostname = hostname_;
  snap.simulated = fn_.nvmlGpuletSimulated != nullptr && fn_.nvmlGpuletSimulated() == 1;
  snap.collected_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  const CounterSet& cs = *counters;
  std::vector<unsigned> gpm_ids;
  for (const Counter& c : cs.metrics) {
    if (!IsGpmSource(c.info->source)) continue;
    const unsigned id = GpmMetric(c.info->source).first;
    if (std::find(gpm_ids.begin(), gpm_ids.end(), id) == gpm_ids.end()) gpm_ids.push_back(id);
  }
  if (!gpm_ids.empty()) PrimeGpm();

  for (const gpu::Gpu& g : inventory_.gpus) {
    GpuHealth health;
    health.gpu = {g.index, g.uuid, g.pci_bus_id, g.name};
    const uint64_t last_xid = xids_ != nullptr ? xids_->Last(g.index) : 0;

    nvmlDevice_t dev = Handle(g.index);
    if (dev == nullptr) {
      health.up = false;
      health.reason = "no NVML handle";
    }
    // One target per entity: the whole GPU, or each MIG GPU instance (first device of each GI).
    struct Entity {
      EntitySample sample;
      nvmlDevice_t instance = nullptr;  // MIG device handle, null for whole GPUs
    };
    std::vector<Entity> entities;
    if (health.up) {
      if (g.mig_enabled && !g.mig_devices.empty()) {
        std::set<unsigned> seen_gi;
        for (const gpu::MigDevice& mig : g.mig_devices) {
          if (!seen_gi.insert(mig.gpu_instance_id).second) continue;
          Entity e;
          e.sample.key = {g.index, static_cast<int>(mig.gpu_instance_id)};
          e.sample.mig_profile = mig.profile;
          auto key = std::make_pair(g.index, mig.mig_index);
          auto it = mig_handles_.find(key);
          if (it == mig_handles_.end() && fn_.nvmlDeviceGetMigDeviceHandleByIndex) {
            nvmlDevice_t h = nullptr;
            if (fn_.nvmlDeviceGetMigDeviceHandleByIndex(dev, mig.mig_index, &h) == NVML_SUCCESS) {
              it = mig_handles_.emplace(key, h).first;
            }
          }
          if (it != mig_handles_.end()) e.instance = it->second;
          entities.push_back(std::move(e));
        }
      } else {
        Entity e;
        e.sample.key = {g.index, -1};
        entities.push_back(std::move(e));
      }
    }

    EntityReader parent(fn_, dev);
    for (Entity& e : entities) {
      if (!health.up) break;
      e.sample.gpu = health.gpu;
      e.sample.values.resize(cs.metrics.size());
      std::optional<EntityReader> instance;
      if (e.instance != nullptr) instance.emplace(fn_, e.instance);
      GpmReadings gpm;
      if (!gpm_ids.empty()) gpm = ReadGpm(dev, g, e.sample.key, gpm_ids);
      for (size_t m = 0; m < cs.metrics.size(); ++m) {
        const FieldInfo& f = *cs.metrics[m].info;
        EntityReader* reader = &parent;
        if (!e.sample.mig_profile.empty()) {
          if (f.mig_scope == MigScope::kNone) continue;
          if (f.mig_scope == MigScope::kInstance) {
            if (!instance) continue;
            reader = &*instance;
          }
        }
        if (f.source == Source::kXidCount) {
          // One series per XID code seen in the window (whole GPUs only, as DCGM counts them).
          if (xids_ == nullptr || !e.sample.mig_profile.empty()) continue;
          e.sample.xid_counts = xids_->CountsInWindow(g.index);
          int64_t total = 0;
          for (const auto& [code, n] : e.sample.xid_counts) total += n;
          if (total > 0) e.sample.values[m] = Value::Int(total);
          continue;
        }
        Reading r =
            IsGpmSource(f.source) ? GpmReading(gpm, f.source) : reader->Read(f.source, last_xid);
        if (!r.value && r.rc == NVML_SUCCESS) continue;  // GPM warming up: no value yet
        if (r.value) {
          e.sample.values[m] = r.value;
        } else if (IsLost(r.rc)) {
          health.up = false;
          health.reason = std::string(cs.metrics[m].field) + ": " + gpu::NvmlReturnName(r.rc);
          break;
        } else if (logged_unsupported_.insert(cs.metrics[m].field).second) {
          spdlog::info("event=field_unavailable field={} gpu={} nvml={} action=skipped",
                       cs.metrics[m].field, g.index, gpu::NvmlReturnName(r.rc));
        }
      }
      for (const Counter& l : cs.labels) {
        e.sample.labels.push_back(LabelValue(l.info->source, inventory_, g));
      }
    }

    if (health.up && processes_) {
      std::map<EntityKey, std::vector<ProcessUse>> procs;
      if (processes_->Read(g, dev, &procs)) {
        for (Entity& e : entities) {
          e.sample.processes_read = true;
          auto it = procs.find(e.sample.key);
          if (it != procs.end()) e.sample.processes = std::move(it->second);
        }
      }
    }
    if (health.up) {
      if (logged_lost_.erase(g.index) > 0) {
        spdlog::info("event=gpu_readable gpu={} uuid={}", g.index, g.uuid);
      }
      for (Entity& e : entities) snap.entities.push_back(std::move(e.sample));
    } else if (logged_lost_.insert(g.index).second) {
      spdlog::warn("event=gpu_lost gpu={} uuid={} reason=\"{}\" action=series_dropped", g.index,
                   g.uuid, health.reason);
    }
    snap.gpus.push_back(std::move(health));
  }
  if (processes_) processes_->EndCollection();
  return snap;
}

void Sampler::EnableProcesses(std::string proc_root) {
  processes_ = std::make_unique<ProcessReader>(fn_, std::move(proc_root));
}

}  // namespace gpulet::metrics
