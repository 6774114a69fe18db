#include "metrics/sampler.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <optional>

namespace gpulet::metrics {

void XidLog::Record(unsigned gpu, uint64_t xid) {
  std::lock_guard lock(mu_);
  last_[gpu] = xid;
}

uint64_t XidLog::Last(unsigned gpu) const {
  std::lock_guard lock(mu_);
  auto it = last_.find(gpu);
  return it == last_.end() ? 0 : it->second;
}

namespace {

constexpr uint64_t kMiB = 1024ull * 1024ull;

// The outcome of reading one field: a value, "not available here", or "the GPU is lost".
struct Reading {
  std::optional<Value> value;
  nvmlReturn_t rc = NVML_SUCCESS;
};

// Memoises the NVML queries of one entity for one collection.
class EntityReader {
 public:
  EntityReader(const gpu::NvmlFunctions& fn, nvmlDevice_t dev) : fn_(fn), dev_(dev) {}

  Reading Read(Source source, uint64_t last_xid) {
    switch (source) {
      case Source::kSmClock: return Clock(NVML_CLOCK_SM);
      case Source::kMemClock: return Clock(NVML_CLOCK_MEM);
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
      case Source::kXid: return {Value::Int(static_cast<int64_t>(last_xid)), NVML_SUCCESS};
      case Source::kFbFree:
      case Source::kFbUsed:
      case Source::kFbTotal: {
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
      default: return Unsupported();
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
  std::optional<nvmlMemory_t> mem_;
  nvmlReturn_t mem_rc_ = NVML_SUCCESS;
  std::optional<std::array<unsigned, 4>> rows_;
  nvmlReturn_t rows_rc_ = NVML_SUCCESS;
};

bool IsLost(nvmlReturn_t rc) {
  return rc == NVML_ERROR_GPU_IS_LOST || rc == NVML_ERROR_GPU_NOT_FOUND;
}

std::string LabelValue(Source s, const gpu::Inventory& inv, const gpu::Gpu& g) {
  switch (s) {
    case Source::kDriverVersion: return inv.driver_version;
    case Source::kCudaDriverVersion: return inv.cuda_version;
    case Source::kDeviceName: return g.name;
    case Source::kDeviceUuid: return g.uuid;
    case Source::kPciBusId: return g.pci_bus_id;
    default: return "";
  }
}

}  // namespace

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
  snap.collected_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  const CounterSet& cs = *counters;

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
        Reading r = reader->Read(f.source, last_xid);
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
  return snap;
}

}  // namespace gpulet::metrics
