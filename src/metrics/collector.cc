#include "metrics/collector.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace gpulet::metrics {

void Publisher::SetSnapshot(std::shared_ptr<const Snapshot> snapshot) {
  std::lock_guard lock(render_mu_);
  snapshot_ = std::move(snapshot);
  RenderLocked();
}

void Publisher::SetPods(PodMap pods) {
  std::lock_guard lock(render_mu_);
  if (pods == pods_) return;
  pods_ = std::move(pods);
  if (snapshot_) RenderLocked();
}

void Publisher::SetJobs(JobMap jobs) {
  std::lock_guard lock(render_mu_);
  if (jobs == jobs_) return;
  jobs_ = std::move(jobs);
  if (snapshot_) RenderLocked();
}

void Publisher::SetExtra(std::string text) {
  std::lock_guard lock(render_mu_);
  if (text == extra_) return;
  extra_ = std::move(text);
  if (snapshot_) RenderLocked();
}

std::shared_ptr<const Rendered> Publisher::Current() const {
  std::lock_guard lock(current_mu_);
  return current_;
}

void Publisher::RenderLocked() {
  auto r = std::make_shared<Rendered>();
  r->text = Render(*snapshot_, pods_, {Format::kText004, series_per_pod_, pod_uid_label_}, &jobs_);
  r->openmetrics =
      Render(*snapshot_, pods_, {Format::kOpenMetrics, series_per_pod_, pod_uid_label_}, &jobs_);
  if (!extra_.empty()) {
    r->text += extra_;
    const size_t eof = r->openmetrics.rfind("# EOF\n");
    r->openmetrics.insert(eof == std::string::npos ? r->openmetrics.size() : eof, extra_);
  }
  r->collected_at_ms = snapshot_->collected_at_ms;
  size_t series = 0;
  bool line_start = true;
  for (char c : r->text) {
    if (line_start && c != '#') ++series;
    line_start = c == '\n';
  }
  r->series = series;
  r->generation = ++generation_;
  std::lock_guard lock(current_mu_);
  current_ = std::move(r);
}

Collector::Collector(Sampler& sampler, std::shared_ptr<const CounterSet> counters,
                     std::chrono::milliseconds interval, Publisher& publisher, Clock& clock)
    : sampler_(sampler),
      interval_(std::max(interval, std::chrono::milliseconds(1))),
      publisher_(publisher),
      clock_(clock),
      counters_(std::move(counters)) {}

Collector::~Collector() { Stop(); }

void Collector::Start() {
  CollectOnce();
  thread_ = std::thread([this] { Run(); });
}

void Collector::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    if (sleep_) sleep_->Stop();
  }
  if (thread_.joinable()) thread_.join();
}

void Collector::SetCounters(std::shared_ptr<const CounterSet> counters) {
  std::lock_guard lock(mu_);
  counters_ = std::move(counters);
  wake_ = true;
  if (sleep_) sleep_->Stop();
}

void Collector::Wake() {
  std::lock_guard lock(mu_);
  wake_ = true;
  if (sleep_) sleep_->Stop();
}

void Collector::CollectOnce() {
  std::shared_ptr<const CounterSet> counters;
  {
    std::lock_guard lock(mu_);
    counters = counters_;
  }
  auto snapshot = std::make_shared<const Snapshot>(sampler_.Sample(std::move(counters)));
  if (before_publish_) before_publish_();
  publisher_.SetSnapshot(std::move(snapshot));
  collections_.fetch_add(1);
}

void Collector::Run() {
  auto next = clock_.Now() + interval_;
  for (;;) {
    std::shared_ptr<StopSignal> sleep;
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      if (!wake_) sleep = sleep_ = std::make_shared<StopSignal>();
    }
    if (sleep) clock_.SleepUntil(next, *sleep);  // ends early on Wake/SetCounters/Stop
    {
      std::lock_guard lock(mu_);
      sleep_.reset();
      if (stop_) return;
      wake_ = false;
    }
    CollectOnce();
    // Fixed-rate ticks; after a stall, start again from now rather than bursting.
    next += interval_;
    const auto now = clock_.Now();
    if (next < now) next = now + interval_;
  }
}

XidWatcher::XidWatcher(const gpu::NvmlFunctions& fn, std::vector<nvmlDevice_t> handles, XidLog& log,
                       std::function<void()> on_xid)
    : fn_(fn), handles_(std::move(handles)), log_(log), on_xid_(std::move(on_xid)) {}

XidWatcher::~XidWatcher() { Stop(); }

void XidWatcher::Start() {
  nvmlReturn_t rc = fn_.nvmlEventSetCreate(&set_);
  if (rc != NVML_SUCCESS) {
    spdlog::warn("event=xid_watch_unavailable nvml={} effect=\"DCGM_FI_DEV_XID_ERRORS stays 0\"",
                 gpu::NvmlReturnName(rc));
    set_ = nullptr;
    return;
  }
  size_t registered = 0;
  for (size_t i = 0; i < handles_.size(); ++i) {
    if (handles_[i] == nullptr) continue;
    rc = fn_.nvmlDeviceRegisterEvents(handles_[i], nvmlEventTypeXidCriticalError, set_);
    if (rc == NVML_SUCCESS) {
      ++registered;
    } else {
      spdlog::warn("event=xid_watch_unavailable gpu={} nvml={}", i, gpu::NvmlReturnName(rc));
    }
  }
  if (registered == 0) {
    fn_.nvmlEventSetFree(set_);
    set_ = nullptr;
    return;
  }
  thread_ = std::thread([this] { Run(); });
}

void XidWatcher::Stop() {
  stop_.Stop();
  if (thread_.joinable()) thread_.join();
  if (set_ != nullptr) {
    fn_.nvmlEventSetFree(set_);
    set_ = nullptr;
  }
}

void XidWatcher::Run() {
  // The wait timeout bounds how long Stop() takes.
  constexpr unsigned kWaitMs = 200;
  while (!stop_.stopped()) {
    nvmlEventData_t data{};
    nvmlReturn_t rc = fn_.nvmlEventSetWait_v2(set_, &data, kWaitMs);
    if (rc == NVML_ERROR_TIMEOUT) continue;
    if (rc != NVML_SUCCESS) {
      spdlog::debug("event=xid_wait_failed nvml={}", gpu::NvmlReturnName(rc));
      RealClock().SleepFor(std::chrono::milliseconds(kWaitMs), stop_);  // ends at once on Stop()
      continue;
    }
    if ((data.eventType & nvmlEventTypeXidCriticalError) == 0) continue;
    auto it = std::find(handles_.begin(), handles_.end(), data.device);
    if (it == handles_.end()) continue;
    const unsigned gpu = static_cast<unsigned>(it - handles_.begin());
    log_.Record(gpu, data.eventData);
    spdlog::warn("event=xid gpu={} xid={} msg=\"{}\"", gpu, data.eventData,
                 XidMessage(static_cast<int64_t>(data.eventData)));
    if (on_xid_) on_xid_();
  }
}

}  // namespace gpulet::metrics
