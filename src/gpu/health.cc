#include "gpu/health.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include <charconv>
#include <sstream>

#include "gpu/nvml.h"

namespace gpulet::gpu {

const DeviceHealth& HealthSnapshot::Get(const std::string& uuid) const {
  static const DeviceHealth kHealthy;
  auto it = devices.find(uuid);
  return it == devices.end() ? kHealthy : it->second;
}

HealthSnapshot HealthBoard::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

HealthSnapshot HealthBoard::WaitNewer(uint64_t seen, std::chrono::milliseconds timeout,
                                      const std::function<bool()>& stop) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return snapshot_.version > seen || (stop && stop()); });
  return snapshot_;
}

bool HealthBoard::Update(const std::map<std::string, DeviceHealth>& changes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    bool changed = false;
    for (const auto& [uuid, health] : changes) {
      auto it = snapshot_.devices.find(uuid);
      if (it != snapshot_.devices.end() && it->second == health) continue;
      snapshot_.devices[uuid] = health;
      changed = true;
    }
    if (!changed) return false;
    ++snapshot_.version;
  }
  cv_.notify_all();
  return true;
}

void HealthBoard::Wake() const {
  // Taking the lock orders the wake after any waiter's predicate check.
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

const std::set<uint64_t>& DefaultIgnoredXids() {
  static const std::set<uint64_t> kIgnored = {13, 31, 43, 45, 68, 109};
  return kIgnored;
}

namespace {

struct XidList {
  bool all = false;
  std::set<uint64_t> xids;
};

Result<XidList> ParseXidList(const std::string& var, const std::string& value) {
  XidList out;
  std::stringstream ss(value);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t");
    size_t e = item.find_last_not_of(" \t");
    if (b == std::string::npos) continue;
    item = item.substr(b, e - b + 1);
    std::string lower;
    for (char c : item) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "all" || lower == "xids") {
      out.all = true;
      continue;
    }
    uint64_t xid = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), xid);
    if (ec != std::errc() || ptr != item.data() + item.size()) {
      return Status(ErrorCode::kInvalidInput,
                    var + ": invalid entry \"" + item + "\" (want all, xids or XID numbers)");
    }
    out.xids.insert(xid);
  }
  return out;
}

}  // namespace

Result<HealthPolicy> ParseHealthPolicy(const std::string& disable_env,
                                       const std::string& enable_env) {
  HealthPolicy policy;
  policy.ignored_xids = DefaultIgnoredXids();
  Result<XidList> disabled = ParseXidList("DP_DISABLE_HEALTHCHECKS", disable_env);
  if (!disabled.ok()) return disabled.status();
  Result<XidList> enabled = ParseXidList("DP_ENABLE_HEALTHCHECKS", enable_env);
  if (!enabled.ok()) return enabled.status();

  std::string lower;
  for (char c : disable_env)
    lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // "all" switches off every check; "xids" only the XID-based ones.
  if (lower.find("all") != std::string::npos) policy.all_disabled = true;
  if (disabled->all) policy.all_xids_ignored = true;
  policy.ignored_xids.insert(disabled->xids.begin(), disabled->xids.end());
  // Explicitly enabled XIDs override disabled ones, defaults included.
  if (enabled->all) {
    policy.all_disabled = false;
    policy.all_xids_ignored = false;
    policy.ignored_xids.clear();
  }
  for (uint64_t xid : enabled->xids) policy.ignored_xids.erase(xid);
  return policy;
}

HealthTracker::HealthTracker(const Inventory& inventory, HealthPolicy policy, const Clock& clock,
                             HealthBoard& board)
    : inventory_(inventory), policy_(std::move(policy)), clock_(clock), board_(board) {
  // The board may outlive an earlier tracker (re-discovery): what it knows about a UUID stands.
  const HealthSnapshot known = board_.Current();
  std::map<std::string, DeviceHealth> initial;
  auto seed = [&](const std::string& uuid) {
    State s;
    const DeviceHealth& h = known.Get(uuid);
    if (!h.healthy) {
      s.health = h;
      s.last_bad = clock_.Now();  // the event's time left with the old tracker: count from now
      spdlog::info("event=device_health_kept uuid={} reason=\"{}\"", uuid, h.reason);
    } else {
      initial[uuid] = DeviceHealth{};
    }
    state_[uuid] = s;
  };
  for (const Gpu& g : inventory_.gpus) {
    seed(g.uuid);
    for (const MigDevice& m : g.mig_devices) seed(m.uuid);
  }
  board_.Update(initial);
}

void HealthTracker::MarkBad(const std::string& uuid, const std::string& reason) {
  State& s = state_[uuid];
  s.last_bad = clock_.Now();
  if (s.health.healthy) {
    s.health = DeviceHealth{false, reason};
    pending_[uuid] = s.health;
    spdlog::warn("event=device_unhealthy uuid={} reason=\"{}\"", uuid, reason);
  }
}

void HealthTracker::Publish() {
  if (pending_.empty()) return;
  board_.Update(pending_);
  pending_.clear();
}

void HealthTracker::OnEvent(unsigned gpu_index, EventKind kind, uint64_t data,
                            std::optional<unsigned> gpu_instance,
                            std::optional<unsigned> compute_instance) {
  if (policy_.all_disabled || gpu_index >= inventory_.gpus.size()) return;
  const Gpu& gpu = inventory_.gpus[gpu_index];
  std::string reason;
  switch (kind) {
    case EventKind::kXid:
      if (!policy_.XidCounts(data)) {
        spdlog::info("event=xid_ignored gpu={} uuid={} xid={}", gpu_index, gpu.uuid, data);
        return;
      }
      reason = "XID " + std::to_string(data);
      break;
    case EventKind::kDoubleBitEcc:
      reason = "double-bit ECC error";
      break;
    case EventKind::kSingleBitEcc:
      spdlog::info("event=single_bit_ecc gpu={} uuid={}", gpu_index, gpu.uuid);
      return;
  }
  // A MIG event names its GPU and compute instance; it marks that MIG device only.
  std::string target = gpu.uuid;
  if (gpu_instance && compute_instance) {
    for (const MigDevice& m : gpu.mig_devices) {
      if (m.gpu_instance_id == *gpu_instance && m.compute_instance_id == *compute_instance) {
        target = m.uuid;
      }
    }
  }
  MarkBad(target, reason);
  Publish();
}

void HealthTracker::OnProbe(const std::vector<ProbeResult>& results) {
  if (policy_.all_disabled) return;
  const Clock::TimePoint now = clock_.Now();
  for (size_t i = 0; i < results.size() && i < inventory_.gpus.size(); ++i) {
    const Gpu& gpu = inventory_.gpus[i];
    if (results[i] == ProbeResult::kLost) {
      MarkBad(gpu.uuid, "GPU is lost");
      continue;
    }
    if (results[i] != ProbeResult::kOk || policy_.quiet_period.count() == 0) continue;
    auto recover = [&](const std::string& uuid) {
      State& s = state_[uuid];
      if (s.health.healthy || now - s.last_bad < policy_.quiet_period) return;
      spdlog::info("event=device_recovered uuid={} after=\"{}\"", uuid, s.health.reason);
      s.health = DeviceHealth{};
      pending_[uuid] = s.health;
    };
    recover(gpu.uuid);
    for (const MigDevice& m : gpu.mig_devices) recover(m.uuid);
  }
  Publish();
}

HealthMonitor::HealthMonitor(std::shared_ptr<const Nvml> nvml, const Inventory& inventory,
                             HealthMonitorOptions options, Clock& clock, HealthBoard& board)
    : nvml_(std::move(nvml)),
      inventory_(inventory),
      options_(options),
      clock_(clock),
      tracker_(inventory, options.policy, clock, board) {}

HealthMonitor::~HealthMonitor() { Stop(); }

Status HealthMonitor::Start() {
  if (options_.policy.all_disabled) {
    spdlog::warn("event=health_checks_disabled reason=DP_DISABLE_HEALTHCHECKS");
    return Status::Ok();
  }
  const NvmlFunctions& fn = nvml_->fn();
  nvmlEventSet_t set = nullptr;
  nvmlReturn_t rc = fn.nvmlEventSetCreate(&set);
  if (rc != NVML_SUCCESS) {
    spdlog::warn("event=health_events_unavailable call=nvmlEventSetCreate error=\"{}\"",
                 nvml_->ErrorText(rc));
    set = nullptr;
  }
  event_set_ = set;
  handles_.assign(inventory_.gpus.size(), nullptr);
  for (const Gpu& gpu : inventory_.gpus) {
    nvmlDevice_t dev = nullptr;
    rc = fn.nvmlDeviceGetHandleByIndex_v2(gpu.index, &dev);
    if (rc != NVML_SUCCESS) {
      spdlog::warn("event=health_handle_failed gpu={} error=\"{}\"", gpu.index,
                   nvml_->ErrorText(rc));
      continue;
    }
    handles_[gpu.index] = dev;
    if (!set) continue;
    const unsigned long long mask = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError |
                                    nvmlEventTypeSingleBitEccError;
    rc = fn.nvmlDeviceRegisterEvents(dev, mask, set);
    if (rc != NVML_SUCCESS) {
      spdlog::warn("event=health_register_failed gpu={} uuid={} error=\"{}\" fallback=probe",
                   gpu.index, gpu.uuid, nvml_->ErrorText(rc));
    }
  }
  stop_ = std::make_unique<StopSignal>();
  thread_ = std::thread([this] { Run(); });
  spdlog::info("event=health_monitor_started gpus={} quiet_period_ms={}", inventory_.gpus.size(),
               options_.policy.quiet_period.count());
  return Status::Ok();
}

void HealthMonitor::Stop() {
  if (stop_) stop_->Stop();
  if (thread_.joinable()) thread_.join();
  if (event_set_) {
    nvml_->fn().nvmlEventSetFree(static_cast<nvmlEventSet_t>(event_set_));
    event_set_ = nullptr;
  }
}

void HealthMonitor::Run() {
  const NvmlFunctions& fn = nvml_->fn();
  auto set = static_cast<nvmlEventSet_t>(event_set_);
  Clock::TimePoint next_probe = clock_.Now();
  StopSignal& stop = *stop_;
  auto stopped = [&stop] { return stop.stopped(); };
  auto pause = [this, &stop](std::chrono::milliseconds d) { clock_.SleepFor(d, stop); };
  while (!stopped()) {
    if (set) {
      nvmlEventData_t data{};
      nvmlReturn_t rc =
          fn.nvmlEventSetWait_v2(set, &data, static_cast<unsigned>(options_.event_wait.count()));
      if (rc == NVML_SUCCESS) {
        unsigned index = static_cast<unsigned>(handles_.size());
        for (size_t i = 0; i < handles_.size(); ++i) {
          if (handles_[i] == static_cast<void*>(data.device)) index = static_cast<unsigned>(i);
        }
        std::optional<unsigned> gi, ci;
        if (data.gpuInstanceId != 0xFFFFFFFFu && data.computeInstanceId != 0xFFFFFFFFu) {
          gi = data.gpuInstanceId;
          ci = data.computeInstanceId;
        }
        HealthTracker::EventKind kind = HealthTracker::EventKind::kSingleBitEcc;
        if (data.eventType & nvmlEventTypeXidCriticalError) {
          kind = HealthTracker::EventKind::kXid;
        } else if (data.eventType & nvmlEventTypeDoubleBitEccError) {
          kind = HealthTracker::EventKind::kDoubleBitEcc;
        }
        if (index < handles_.size()) {
          spdlog::debug("event=nvml_event gpu={} type={} data={}", index, data.eventType,
                        data.eventData);
          tracker_.OnEvent(index, kind, data.eventData, gi, ci);
        } else {
          spdlog::warn("event=nvml_event_unknown_device type={} data={}", data.eventType,
                       data.eventData);
        }
      } else if (rc != NVML_ERROR_TIMEOUT) {
        // Unlike NVIDIA's plugin we do not mark every GPU unhealthy on a failed wait: a lost GPU
        // is caught by the probe, and a transient error must not take the node down.
        spdlog::warn("event=nvml_event_wait_failed error=\"{}\"", nvml_->ErrorText(rc));
        pause(options_.event_wait);
      }
    } else {
      pause(options_.event_wait);
    }
    if (clock_.Now() < next_probe) continue;
    next_probe = clock_.Now() + options_.probe_interval;
    std::vector<HealthTracker::ProbeResult> results(inventory_.gpus.size(),
                                                    HealthTracker::ProbeResult::kOk);
    for (size_t i = 0; i < inventory_.gpus.size(); ++i) {
      nvmlDevice_t dev = nullptr;
      nvmlReturn_t rc = fn.nvmlDeviceGetHandleByIndex_v2(static_cast<unsigned>(i), &dev);
      if (rc == NVML_SUCCESS) {
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
        rc = fn.nvmlDeviceGetUUID(dev, uuid, sizeof(uuid));
        if (rc == NVML_SUCCESS) {
          nvmlMemory_t mem{};
          rc = fn.nvmlDeviceGetMemoryInfo(dev, &mem);
        }
      }
      if (rc == NVML_ERROR_GPU_IS_LOST) {
        results[i] = HealthTracker::ProbeResult::kLost;
      } else if (rc != NVML_SUCCESS) {
        results[i] = HealthTracker::ProbeResult::kOtherError;
      }
    }
    tracker_.OnProbe(results);
    // One line per probe cycle (debug): tests count cycles instead of sleeping.
    spdlog::debug("event=health_probe lost={}",
                  std::count(results.begin(), results.end(), HealthTracker::ProbeResult::kLost));
  }
}

}  // namespace gpulet::gpu
