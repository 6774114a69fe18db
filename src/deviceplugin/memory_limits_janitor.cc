#include "deviceplugin/memory_limits_janitor.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>

#include "common/tenant_file.h"
#include "deviceplugin/pod_resources_client.h"

namespace gpulet::deviceplugin {

namespace {

Result<KubeletInstance> SocketIdentity(const std::string& socket) {
  struct stat st {};
  if (::stat(socket.c_str(), &st) != 0) {
    return Status(ErrorCode::kUnavailable, "pod-resources socket " + socket + " not found");
  }
  return KubeletInstance{
      st.st_dev, st.st_ino,
      static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
}

}  // namespace

Result<PodDeviceList> ListPodDevices(const std::string& socket, std::chrono::milliseconds timeout) {
  Result<KubeletInstance> before = SocketIdentity(socket);
  if (!before.ok()) return before.status();
  auto stub = PodResourcesStub(socket);
  Result<v1::ListPodResourcesResponse> resp = ListPodResources(*stub, socket, timeout);
  if (!resp.ok()) return resp.status();
  Result<KubeletInstance> after = SocketIdentity(socket);
  if (!after.ok()) return after.status();
  if (!(*after == *before)) {
    return Status(ErrorCode::kUnavailable,
                  "pod-resources socket " + socket + " was replaced during the List");
  }
  PodDeviceList out;
  out.kubelet = *after;
  for (const auto& pod : resp->pod_resources()) {
    for (const auto& c : pod.containers()) {
      for (const auto& d : c.devices()) {
        for (const std::string& id : d.device_ids()) {
          out.devices[id] = PodContainer{pod.namespace_(), pod.name(), c.name()};
        }
      }
    }
  }
  return out;
}

std::set<std::string> StateDirsOf(const std::map<std::string, MemoryLimitSettings>& settings) {
  std::set<std::string> out;
  for (const auto& [name, s] : settings) out.insert(s.state_dir);
  return out;
}

void DeviceAbsence::Observe(const std::set<std::string>& listed, const KubeletInstance& kubelet,
                            Clock::TimePoint now) {
  if (!observed_ || !(kubelet == kubelet_)) {
    // Another kubelet (or our own start): what earlier Lists missed says nothing about this one,
    // which may still be restoring its pods.
    if (observed_) {
      spdlog::info("event=kubelet_restart_seen action=absence_evidence_reset lists={}",
                   lists_.size());
    }
    lists_.clear();
    last_seen_.clear();
    kubelet_ = kubelet;
    observed_ = true;
  }
  lists_.push_back(now);
  for (const std::string& id : listed) last_seen_[id] = now;
  latest_ = listed;
  // Lists older than needed: keep `lists` of them spanning `span` (see Confirmed).
  while (lists_.size() > static_cast<size_t>(std::max(options_.lists, 1)) &&
         lists_[1] <= lists_.back() - options_.span) {
    lists_.pop_front();
  }
  // IDs not listed for long enough are forgotten (they count from the first kept List).
  for (auto it = last_seen_.begin(); it != last_seen_.end();) {
    it = it->second < lists_.front() ? last_seen_.erase(it) : std::next(it);
  }
}

bool DeviceAbsence::Confirmed(Clock::TimePoint after_or_at) const {
  auto first = std::lower_bound(lists_.begin(), lists_.end(), after_or_at);
  if (first == lists_.end()) return false;
  const auto count = std::distance(first, lists_.end());
  return count >= options_.lists && lists_.back() - *first >= options_.span;
}

bool DeviceAbsence::Gone(const std::string& id, Clock::TimePoint not_before) const {
  if (!observed_) return false;
  Clock::TimePoint from = not_before;
  if (auto it = last_seen_.find(id); it != last_seen_.end()) {
    from = std::max(from, it->second + Clock::Duration(1));  // the Lists after the last naming it
  }
  return Confirmed(from);
}

bool DeviceAbsence::AllGone(const std::vector<std::string>& ids,
                            Clock::TimePoint not_before) const {
  if (ids.empty()) return observed_ && Confirmed(not_before);
  return std::all_of(ids.begin(), ids.end(),
                     [&](const std::string& id) { return Gone(id, not_before); });
}

bool DeviceAbsence::Listed(const std::string& id) const { return latest_.count(id) != 0; }

MemoryLimitJanitor::MemoryLimitJanitor(std::set<std::string> state_dirs, std::string socket,
                                       JanitorOptions options)
    : state_dirs_(std::move(state_dirs)),
      socket_(!socket.empty() ? std::move(socket)
              : std::getenv("GPULET_POD_RESOURCES_SOCKET") != nullptr
                  ? std::getenv("GPULET_POD_RESOURCES_SOCKET")
                  : kPodResourcesSocket),
      options_(options),
      clock_(options.clock != nullptr ? *options.clock : RealClock()),
      absence_(options.absence) {}

MemoryLimitJanitor::~MemoryLimitJanitor() { Stop(); }

Result<std::vector<std::string>> MemoryLimitJanitor::RunOnce() {
  std::lock_guard run(run_mu_);
  const Clock::TimePoint now = clock_.Now();
  auto devices = ListPodDevices(socket_, std::chrono::seconds(5));
  if (!devices.ok()) return devices.status();
  std::set<std::string> listed;
  for (const auto& [id, owner] : devices->devices) listed.insert(id);
  absence_.Observe(listed, devices->kubelet, now);
  std::vector<std::string> removed;
  std::set<std::string> present;
  for (const std::string& state_dir : state_dirs_) {
    Result<TenantDir> root = TenantDir::Open(state_dir);
    if (!root.ok()) continue;  // not made yet: no Allocate so far
    const std::vector<ContainerDir> dirs = ReadContainerDirs(*root);
    const std::set<std::string> superseded = SupersededDirs(dirs);
    for (const ContainerDir& d : dirs) {
      const std::string path = state_dir + "/" + d.name;
      const Clock::TimePoint first = first_seen_.emplace(path, now).first->second;
      present.insert(path);
      const bool newer = superseded.count(d.name) != 0;
      if (!newer && !absence_.AllGone(d.device_ids, first)) continue;
      if (Status s = root->RemoveTree(d.name); !s.ok()) {
        spdlog::warn("event=memory_limit_dir_remove_failed dir={} error=\"{}\"", path, s.message());
        continue;
      }
      spdlog::info("event=memory_limit_dir_removed dir={} reason={}", path,
                   newer ? "superseded_by_newer_allocate" : "devices_no_longer_listed");
      removed.push_back(path);
    }
  }
  for (auto it = first_seen_.begin(); it != first_seen_.end();) {
    it = present.count(it->first) != 0 ? std::next(it) : first_seen_.erase(it);
  }
  for (const std::string& r : removed) first_seen_.erase(r);
  return removed;
}

void MemoryLimitJanitor::Start() {
  if (state_dirs_.empty() || thread_.joinable()) return;
  thread_ = std::thread([this] {
    bool failing = false;
    do {
      auto r = RunOnce();
      if (!r.ok() && !failing) {
        spdlog::warn("event=memory_limit_janitor_unavailable error=\"{}\"", r.status().message());
      }
      failing = !r.ok();
    } while (clock_.SleepFor(options_.interval, stop_));
  });
}

void MemoryLimitJanitor::Stop() {
  stop_.Stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace gpulet::deviceplugin
