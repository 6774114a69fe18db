#include "deviceplugin/memory_limits_janitor.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cstdlib>

#include "deviceplugin/pod_resources_client.h"

namespace gpulet::deviceplugin {

Result<std::map<std::string, PodContainer>> ListPodDevices(const std::string& socket,
                                                           std::chrono::milliseconds timeout) {
  struct stat st {};
  if (::stat(socket.c_str(), &st) != 0) {
    return Status(ErrorCode::kUnavailable, "pod-resources socket " + socket + " not found");
  }
  auto stub = PodResourcesStub(socket);
  Result<v1::ListPodResourcesResponse> resp = ListPodResources(*stub, socket, timeout);
  if (!resp.ok()) return resp.status();
  std::map<std::string, PodContainer> out;
  for (const auto& pod : resp->pod_resources()) {
    for (const auto& c : pod.containers()) {
      for (const auto& d : c.devices()) {
        for (const std::string& id : d.device_ids()) {
          out[id] = PodContainer{pod.namespace_(), pod.name(), c.name()};
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

MemoryLimitJanitor::MemoryLimitJanitor(std::set<std::string> state_dirs, std::string socket,
                                       std::chrono::seconds interval, std::chrono::seconds grace)
    : state_dirs_(std::move(state_dirs)),
      socket_(!socket.empty() ? std::move(socket)
              : std::getenv("GPULET_POD_RESOURCES_SOCKET") != nullptr
                  ? std::getenv("GPULET_POD_RESOURCES_SOCKET")
                  : kPodResourcesSocket),
      interval_(interval),
      grace_(grace) {}

MemoryLimitJanitor::~MemoryLimitJanitor() { Stop(); }

Result<std::vector<std::string>> MemoryLimitJanitor::RunOnce() {
  auto devices = ListPodDevices(socket_, std::chrono::seconds(5));
  if (!devices.ok()) return devices.status();
  std::set<std::string> listed;
  for (const auto& [id, owner] : *devices) listed.insert(id);
  std::vector<std::string> removed;
  for (const std::string& dir : state_dirs_) {
    for (std::string& r :
         RemoveReleasedContainerDirs(dir, listed, std::chrono::system_clock::now(), grace_)) {
      spdlog::info("event=memory_limit_dir_removed dir={}", r);
      removed.push_back(std::move(r));
    }
  }
  return removed;
}

void MemoryLimitJanitor::Start() {
  if (state_dirs_.empty() || thread_.joinable()) return;
  thread_ = std::thread([this] {
    bool failing = false;
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      auto r = RunOnce();
      if (!r.ok() && !failing) {
        spdlog::warn("event=memory_limit_janitor_unavailable error=\"{}\"", r.status().message());
      }
      failing = !r.ok();
      lock.lock();
      cv_.wait_for(lock, interval_, [this] { return stop_; });
    }
  });
}

void MemoryLimitJanitor::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace gpulet::deviceplugin
