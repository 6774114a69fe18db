#include "metrics/processes.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

namespace gpulet::metrics {
namespace {

constexpr uint64_t kMiB = 1024ull * 1024ull;
constexpr size_t kUidMinLength = 32;
// A pid not listed for this many reads leaves the cache (pids are reused).
constexpr int kUidCacheReads = 3;

bool IsUidChar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-' || c == '_';
}

// The first "pod<uid>" in a cgroup path, dashes restored.
std::string PodUidInPath(std::string_view path) {
  for (size_t at = path.find("pod"); at != std::string_view::npos; at = path.find("pod", at + 1)) {
    size_t end = at + 3;
    while (end < path.size() && IsUidChar(path[end])) ++end;
    std::string uid(path.substr(at + 3, end - at - 3));
    std::replace(uid.begin(), uid.end(), '_', '-');
    if (uid.size() >= kUidMinLength) return uid;
  }
  return "";
}

// /proc/<pid>/stat is one line of a few hundred bytes; a cgroup file lists one line per hierarchy.
constexpr size_t kStatMaxBytes = 4096;
constexpr size_t kCgroupMaxBytes = 1u << 20;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// At most `max_bytes` of the file `name` in the directory `dir`; nullopt when it cannot be opened
// or read, or is longer.
std::optional<std::string> ReadAt(const Fd& dir, const char* name, size_t max_bytes) {
  const Fd fd(::openat(dir.get(), name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) return std::nullopt;
  }
}

}  // namespace

std::optional<unsigned long long> ProcessStartTime(std::string_view text) {
  const size_t paren = text.rfind(')');
  if (paren == std::string_view::npos) return std::nullopt;
  // After "pid (comm)" come fields 3 (state) onwards, separated by single spaces.
  std::string_view rest = text.substr(paren + 1);
  constexpr int kStartTimeField = 22;
  int field = 2;
  size_t at = 0;
  while (at < rest.size()) {
    while (at < rest.size() && rest[at] == ' ') ++at;
    size_t end = at;
    while (end < rest.size() && rest[end] != ' ' && rest[end] != '\n') ++end;
    if (end == at) break;
    if (++field == kStartTimeField) {
      unsigned long long v = 0;
      auto [ptr, ec] = std::from_chars(rest.data() + at, rest.data() + end, v);
      if (ec != std::errc() || ptr != rest.data() + end) return std::nullopt;
      return v;
    }
    at = end;
  }
  return std::nullopt;
}

std::string PodUidFromCgroup(std::string_view text) {
  // Lines are "hierarchy-ID:controller-list:cgroup-path"; v2's is "0::/path".
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(start, nl - start);
    start = nl + 1;
    const size_t first = line.find(':');
    if (first == std::string_view::npos) continue;
    const size_t second = line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    std::string uid = PodUidInPath(line.substr(second + 1));
    if (!uid.empty()) return uid;
  }
  return "";
}

ProcessReader::ProcessReader(const gpu::NvmlFunctions& fn, std::string proc_root)
    : fn_(fn), proc_root_(std::move(proc_root)) {}

std::string ProcessReader::PodUid(uint32_t pid) {
  uid_age_[pid] = 0;
  // One directory for both reads: on /proc, an open /proc/<pid> keeps naming the process it was
  // opened for (reads fail once that process is gone), never a later holder of the pid.
  const Fd dir(::open((proc_root_ + "/" + std::to_string(pid)).c_str(),
                      O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  const std::optional<std::string> stat =
      dir.get() >= 0 ? ReadAt(dir, "stat", kStatMaxBytes) : std::nullopt;
  const std::optional<unsigned long long> parsed = stat ? ProcessStartTime(*stat) : std::nullopt;
  const bool have_start = parsed.has_value();
  const unsigned long long start = parsed.value_or(0);
  auto it = uid_cache_.find(pid);
  if (it != uid_cache_.end() && have_start && it->second.start_time == start) {
    return it->second.uid;
  }
  const std::optional<std::string> text =
      dir.get() >= 0 ? ReadAt(dir, "cgroup", kCgroupMaxBytes) : std::nullopt;
  // A process that exited or that we may not read is in no pod we can name (not cached: it may
  // be readable next time); nor is one whose start time we could not read (nothing would tell a
  // later process with its pid apart).
  if (!text || !have_start) {
    if (it != uid_cache_.end()) uid_cache_.erase(it);
    return text ? PodUidFromCgroup(*text) : "";
  }
  std::string uid = PodUidFromCgroup(*text);
  uid_cache_[pid] = CachedPod{start, uid};
  return uid;
}

bool ProcessReader::Read(const gpu::Gpu& g, nvmlDevice_t dev,
                         std::map<EntityKey, std::vector<ProcessUse>>* out) {
  if (dev == nullptr || fn_.nvmlDeviceGetComputeRunningProcesses_v3 == nullptr) return false;
  // Processes come and go between the two calls: retry a few times on INSUFFICIENT_SIZE.
  std::vector<nvmlProcessInfo_t> infos(8);
  unsigned count = 0;
  nvmlReturn_t rc = NVML_ERROR_INSUFFICIENT_SIZE;
  for (int attempt = 0; attempt < 4 && rc == NVML_ERROR_INSUFFICIENT_SIZE; ++attempt) {
    count = static_cast<unsigned>(infos.size());
    rc = fn_.nvmlDeviceGetComputeRunningProcesses_v3(dev, &count, infos.data());
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE) infos.resize(std::max<size_t>(count, infos.size()) + 8);
  }
  if (rc != NVML_SUCCESS) return false;
  infos.resize(std::min<size_t>(count, infos.size()));

  // Utilisation since the previous read: the newest sample of each pid.
  std::map<uint32_t, unsigned> sm;
  const bool mig = g.mig_enabled && !g.mig_devices.empty();
  if (!mig && fn_.nvmlDeviceGetProcessUtilization != nullptr) {
    unsigned n = 0;
    unsigned long long& last = last_seen_us_[g.index];
    rc = fn_.nvmlDeviceGetProcessUtilization(dev, nullptr, &n, last);
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE || (rc == NVML_SUCCESS && n > 0)) {
      std::vector<nvmlProcessUtilizationSample_t> samples(n + 8);
      n = static_cast<unsigned>(samples.size());
      rc = fn_.nvmlDeviceGetProcessUtilization(dev, samples.data(), &n, last);
      if (rc == NVML_SUCCESS) {
        std::map<uint32_t, unsigned long long> newest;
        for (unsigned i = 0; i < n && i < samples.size(); ++i) {
          const auto& s = samples[i];
          if (s.timeStamp >= newest[s.pid]) {
            newest[s.pid] = s.timeStamp;
            sm[s.pid] = s.smUtil;
          }
          last = std::max(last, s.timeStamp);
        }
      }
    }
    // NVML_ERROR_NOT_FOUND: no process ran since `last`; each process then reads 0.
  }

  std::map<EntityKey, std::vector<ProcessUse>> by_entity;
  for (const nvmlProcessInfo_t& info : infos) {
    ProcessUse p;
    p.pid = info.pid;
    p.has_memory = info.usedGpuMemory != kNvmlValueNotAvailableUll;
    p.used_bytes = p.has_memory ? info.usedGpuMemory : 0;
    if (!mig) {
      auto s = sm.find(info.pid);
      p.has_util = true;
      p.sm_util = s != sm.end() ? s->second : 0;
    }
    p.pod_uid = PodUid(info.pid);
    const EntityKey key{g.index, mig ? static_cast<int>(info.gpuInstanceId) : -1};
    by_entity[key].push_back(std::move(p));
  }
  // Every entity of the GPU was read, also those without processes.
  if (mig) {
    for (const gpu::MigDevice& m : g.mig_devices) {
      (*out)[{g.index, static_cast<int>(m.gpu_instance_id)}] =
          by_entity[{g.index, static_cast<int>(m.gpu_instance_id)}];
    }
  } else {
    (*out)[{g.index, -1}] = by_entity[{g.index, -1}];
  }
  return true;
}

void ProcessReader::EndCollection() {
  for (auto it = uid_age_.begin(); it != uid_age_.end();) {
    if (++it->second > kUidCacheReads) {
      uid_cache_.erase(it->first);
      it = uid_age_.erase(it);
    } else {
      ++it;
    }
  }
}

std::map<std::string, PodUse> SumByPod(const std::vector<ProcessUse>& processes) {
  std::map<std::string, PodUse> out;
  for (const ProcessUse& p : processes) {
    if (p.pod_uid.empty()) continue;
    PodUse& u = out[p.pod_uid];
    if (p.has_util) u.sm_util += p.sm_util;
    if (p.has_memory) u.fb_used_mib += static_cast<int64_t>(p.used_bytes / kMiB);
  }
  return out;
}

}  // namespace gpulet::metrics
