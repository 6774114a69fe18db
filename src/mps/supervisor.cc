#include "mps/supervisor.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "common/files.h"
#include "common/process.h"

namespace gpulet::mps {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Supervisor::Daemon {
  DaemonSpec spec;
  DaemonPaths paths;
  std::vector<std::string> env;  // the daemon's whole environment, "NAME=value"

  // Guarded by Supervisor::mu_.
  bool healthy = false;
  int pid = -1;

  // Owned by whoever drives the daemon: Start (before the thread exists), then the loop.
  bool down = false;              // dead or failed; waiting for retry_at to restart
  int failures = 0;               // consecutive failures since the last passed check
  gpulet::Clock::TimePoint next;  // next check (up) or restart attempt (down), on clock_
};

namespace {

std::string Errno(int err) { return std::strerror(err); }

// Creates `path` and its missing parents with `mode` (applied exactly, whatever the umask, to
// the directories it creates; existing ones are left as they are).
Status MakeDirs(const std::string& path, mode_t mode) {
  std::string prefix;
  std::stringstream parts(path);
  std::string part;
  if (!path.empty() && path[0] == '/') prefix = "/";
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    if (!prefix.empty() && prefix.back() != '/') prefix += '/';
    prefix += part;
    if (mkdir(prefix.c_str(), mode) == 0) {
      chmod(prefix.c_str(), mode);
      continue;
    }
    const int err = errno;
    struct stat st {};
    if (err == EEXIST && stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
    return Status(ErrorCode::kInvalidInput, "cannot create " + prefix + ": " +
                                                (err == EEXIST ? "not a directory" : Errno(err)));
  }
  return Status::Ok();
}

// An absolute path for `binary`: as given when it contains '/', else the first executable of
// that name in $PATH.
Result<std::string> ResolveBinary(const std::string& binary) {
  if (binary.empty()) return Status(ErrorCode::kInvalidInput, "mps: control binary: empty path");
  if (binary.find('/') != std::string::npos) {
    struct stat st {};
    if (stat(binary.c_str(), &st) != 0) {
      return Status(ErrorCode::kNotFound,
                    "mps: control binary " + binary + ": " + Errno(errno) +
                        " (set the MPS control binary path, or install nvidia-cuda-mps-control)");
    }
    if (!S_ISREG(st.st_mode) || access(binary.c_str(), X_OK) != 0) {
      return Status(ErrorCode::kNotFound,
                    "mps: control binary " + binary + ": not an executable file");
    }
    if (binary[0] == '/') return binary;
    char* real = realpath(binary.c_str(), nullptr);
    std::string out = real != nullptr ? real : binary;
    free(real);
    return out;
  }
  const char* path_env = std::getenv("PATH");
  std::stringstream dirs(path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir;
    candidate.append("/").append(binary);
    struct stat st {};
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return Status(ErrorCode::kNotFound,
                "mps: control binary " + binary + ": not found in PATH (" +
                    (path_env != nullptr ? path_env : "") +
                    "); install the NVIDIA driver's nvidia-cuda-mps-control or configure its path");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int ReadPidFile(const std::string& path) {
  std::string text = ReadFile(path);
  char* end = nullptr;
  long pid = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || pid <= 0 || pid > 1 << 30) return -1;
  return static_cast<int>(pid);
}

// Whether `pid` is a live process serving `pipe_dir`. Reaps it when it is our own dead child
// (which happens when this process is PID 1 or a subreaper and the detached daemon was
// re-parented to us). A zombie counts as dead. A live process whose environment we can read and
// that does not serve `pipe_dir` is someone else's (the pid was reused): not ours, so "dead".
bool DaemonAlive(int pid, const std::string& pipe_dir) {
  if (pid <= 0) return false;
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) return false;
  const std::string proc = "/proc/" + std::to_string(pid);
  std::string stat = ReadFile(proc + "/stat");
  if (stat.empty()) return kill(pid, 0) == 0 || errno == EPERM;
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  const char state = stat[paren + 2];
  if (state == 'Z' || state == 'X' || state == 'x') return false;
  std::string environ_text = ReadFile(proc + "/environ");
  if (environ_text.empty()) return true;  // not ours to read (or a kernel thread): trust the pid
  const std::string want = "CUDA_MPS_PIPE_DIRECTORY=" + pipe_dir;
  size_t start = 0;
  while (start < environ_text.size()) {
    size_t end = environ_text.find('\0', start);
    if (end == std::string::npos) end = environ_text.size();
    if (environ_text.compare(start, end - start, want) == 0) return true;
    start = end + 1;
  }
  return false;
}

// Polls `alive` until it is false or `timeout` passes. True when it ended.
template <typename F>
bool WaitUntilGone(F alive, milliseconds timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  milliseconds step{2};
  while (alive()) {
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(step);
    step = std::min(step * 2, milliseconds(50));
  }
  return true;
}

std::string Join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// The value of `name` in the environment of process `pid` ("" when unreadable or unset).
std::string EnvironOf(int pid, const std::string& name) {
  const std::string text = ReadFile("/proc/" + std::to_string(pid) + "/environ");
  const std::string want = name + "=";
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\0', start);
    if (end == std::string::npos) end = text.size();
    if (text.compare(start, want.size(), want) == 0) {
      return text.substr(start + want.size(), end - start - want.size());
    }
    start = end + 1;
  }
  return "";
}

bool SameSpec(const DaemonSpec& a, const DaemonSpec& b) {
  return a.resource_name == b.resource_name && a.gpu_uuids == b.gpu_uuids &&
         a.gpu_indices == b.gpu_indices && a.memory_bytes == b.memory_bytes &&
         a.replicas == b.replicas;
}

Status ValidateSpecs(const std::vector<DaemonSpec>& specs) {
  std::set<std::string> names;
  for (size_t i = 0; i < specs.size(); ++i) {
    const DaemonSpec& s = specs[i];
    const std::string where = "mps: specs[" + std::to_string(i) + "] (" + s.resource_name + ")";
    if (s.resource_name.empty()) {
      return Status(ErrorCode::kInvalidInput, where + ": resource_name: must not be empty");
    }
    if (!names.insert(s.resource_name).second) {
      return Status(ErrorCode::kInvalidInput, where + ": resource_name: duplicate");
    }
    if (s.gpu_uuids.empty()) {
      return Status(ErrorCode::kInvalidInput, where + ": gpu_uuids: must not be empty");
    }
    if (s.gpu_indices.size() != s.gpu_uuids.size() || s.memory_bytes.size() != s.gpu_uuids.size()) {
      return Status(ErrorCode::kInvalidInput,
                    where + ": gpu_indices and memory_bytes must have one entry per gpu_uuids (" +
                        std::to_string(s.gpu_uuids.size()) + "), got " +
                        std::to_string(s.gpu_indices.size()) + " and " +
                        std::to_string(s.memory_bytes.size()));
    }
    if (s.replicas < 1) {
      return Status(ErrorCode::kInvalidInput,
                    where + ": replicas: must be >= 1, got " + std::to_string(s.replicas));
    }
  }
  return Status::Ok();
}

std::string OneLine(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

}  // namespace

DaemonPaths PathsFor(const std::string& root, const std::string& resource_name) {
  std::string dir = resource_name;
  std::replace(dir.begin(), dir.end(), '/', '_');
  std::string base = root;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const std::string sep = base == "/" ? "" : "/";
  return DaemonPaths{base + sep + dir + "/pipe", base + sep + dir + "/log", base + sep + "shm"};
}

int ActiveThreadPercentage(int replicas) { return std::max(1, 100 / std::max(1, replicas)); }

std::string PinnedMemLimit(uint64_t memory_bytes, int replicas) {
  const uint64_t per = memory_bytes / static_cast<uint64_t>(std::max(1, replicas));
  return std::to_string(per >> 20) + "M";  // bytes → MiB, rounded down
}

std::string PidFilePath(const DaemonPaths& paths) {
  return paths.pipe_dir + "/nvidia-cuda-mps-control.pid";
}

std::string ComputeModesPath(const std::string& root) {
  std::string base = root;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + (base == "/" ? "" : "/") + "compute-modes.json";
}

Supervisor::Supervisor(SupervisorOptions options, std::shared_ptr<gpu::Nvml> nvml,
                       gpulet::Clock& clock)
    : options_(std::move(options)), nvml_(std::move(nvml)), clock_(clock) {}

Supervisor::~Supervisor() { Stop(); }

Result<ControlOutput> Supervisor::RunControl(const Daemon& d, const std::vector<std::string>& args,
                                             const std::vector<std::string>& commands) const {
  CommandSpec spec;
  spec.argv = {binary_};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = d.env;
  for (const std::string& c : commands) spec.stdin_data += c + "\n";
  spec.merge_stderr = true;
  spec.timeout = options_.command_timeout;
  // Read until the client exits, not until EOF: the daemon `-d` forks may hold the pipe open.
  spec.wait_for_eof = false;
  Result<CommandOutput> r = RunCommand(spec);
  if (!r.ok()) {
    if (r.status().code() == ErrorCode::kUnavailable) {
      return Status(ErrorCode::kUnavailable,
                    "mps: " + d.spec.resource_name + ": `" + binary_ + " " + Join(args, " ") +
                        "` gave no answer within " +
                        std::to_string(options_.command_timeout.count()) + " ms" +
                        (commands.empty() ? "" : " (commands: " + Join(commands, "; ") + ")"));
    }
    return Status(r.status().code(), "mps: " + r.status().message());
  }
  return ControlOutput{r->exit_code, std::move(r->out)};
}

Result<ControlOutput> Supervisor::Control(const std::string& resource_name,
                                          const std::vector<std::string>& commands) const {
  const Daemon* daemon = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& d : daemons_) {
      if (d->spec.resource_name == resource_name) daemon = d.get();
    }
  }
  if (daemon != nullptr) return RunControl(*daemon, {}, commands);
  return Status(ErrorCode::kNotFound, "mps: no daemon for resource " + resource_name);
}

Status Supervisor::SaveModes() {
  const std::string path = ComputeModesPath(options_.root);
  if (saved_modes_.empty()) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status(ErrorCode::kInternal, "mps: " + path + ": " + Errno(errno));
    }
    return Status::Ok();
  }
  nlohmann::json modes = nlohmann::json::object();
  for (const auto& [uuid, saved] : saved_modes_) {
    modes[uuid] = {{"index", saved.first}, {"mode", saved.second}};
  }
  return WriteFileAtomic(path, nlohmann::json{{"version", 1}, {"modes", modes}}.dump(2) + "\n");
}

Status Supervisor::SetExclusive(Daemon& d) {
  if (!nvml_) return Status::Ok();
  const gpu::NvmlFunctions& fn = nvml_->fn();
  if (fn.nvmlDeviceGetComputeMode == nullptr || fn.nvmlDeviceSetComputeMode == nullptr) {
    return Status(ErrorCode::kNvmlError,
                  "mps: " + d.spec.resource_name +
                      ": the NVML library has no nvmlDeviceGet/SetComputeMode; cannot run MPS");
  }
  for (size_t i = 0; i < d.spec.gpu_indices.size(); ++i) {
    const unsigned index = d.spec.gpu_indices[i];
    const std::string& uuid = d.spec.gpu_uuids[i];
    const std::string where = "mps: " + d.spec.resource_name + ": GPU " + std::to_string(index);
    nvmlDevice_t dev = nullptr;
    nvmlReturn_t rc = fn.nvmlDeviceGetHandleByIndex_v2(index, &dev);
    if (rc != NVML_SUCCESS) {
      return Status(ErrorCode::kNvmlError,
                    where + ": nvmlDeviceGetHandleByIndex: " + nvml_->ErrorText(rc));
    }
    auto saved = saved_modes_.find(uuid);
    if (saved == saved_modes_.end()) {
      nvmlComputeMode_t mode{};
      rc = fn.nvmlDeviceGetComputeMode(dev, &mode);
      if (rc != NVML_SUCCESS) {
        return Status(ErrorCode::kNvmlError,
                      where + ": nvmlDeviceGetComputeMode: " + nvml_->ErrorText(rc));
      }
      // The original goes to disk before the mode changes: after a crash from here on, the next
      // start reads the truth instead of the EXCLUSIVE_PROCESS it finds.
      saved_modes_[uuid] = {index, static_cast<int>(mode)};
      if (Status st = SaveModes(); !st.ok()) {
        saved_modes_.erase(uuid);
        return Status(st.code(), where + ": cannot keep its compute mode: " + st.message());
      }
    } else if (saved->second.first != index) {
      saved->second.first = index;  // renumbered (a driver reload): restore by the new index
      if (Status st = SaveModes(); !st.ok()) return st;
    }
    rc = fn.nvmlDeviceSetComputeMode(dev, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
    if (rc != NVML_SUCCESS) {
      return Status(
          ErrorCode::kNvmlError,
          where + ": nvmlDeviceSetComputeMode(EXCLUSIVE_PROCESS): " + nvml_->ErrorText(rc));
    }
  }
  return Status::Ok();
}

void Supervisor::RestoreComputeModes(const std::set<std::string>& keep) {
  if (!nvml_) return;
  const gpu::NvmlFunctions& fn = nvml_->fn();
  for (auto it = saved_modes_.begin(); it != saved_modes_.end();) {
    if (keep.count(it->first)) {
      ++it;
      continue;
    }
    const auto [index, mode] = it->second;
    nvmlDevice_t dev = nullptr;
    nvmlReturn_t rc = fn.nvmlDeviceGetHandleByIndex_v2(index, &dev);
    if (rc == NVML_SUCCESS)
      rc = fn.nvmlDeviceSetComputeMode(dev, static_cast<nvmlComputeMode_t>(mode));
    if (rc != NVML_SUCCESS) {
      spdlog::error("event=mps_compute_mode_restore_failed gpu={} uuid={} mode={} error=\"{}\"",
                    index, it->first, mode, nvml_->ErrorText(rc));
    }
    it = saved_modes_.erase(it);
  }
  if (Status st = SaveModes(); !st.ok()) {
    spdlog::error("event=mps_compute_modes_save_failed error=\"{}\"", st.message());
  }
}

Status Supervisor::StartDaemon(Daemon& d) {
  if (Status s = SetExclusive(d); !s.ok()) return s;
  const std::string pid_file = PidFilePath(d.paths);
  Result<ControlOutput> launched = RunControl(d, {"-d"}, {});
  if (!launched.ok()) return launched.status();
  if (launched->exit_code != 0) {
    return Status(ErrorCode::kUnavailable,
                  "mps: " + d.spec.resource_name + ": `" + binary_ + " -d` exited " +
                      std::to_string(launched->exit_code) + ": " + OneLine(launched->out));
  }
  // The control program may return before its pid file is written.
  int pid = -1;
  const auto deadline = SteadyClock::now() + options_.command_timeout;
  while ((pid = ReadPidFile(pid_file)) <= 0 && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  if (pid <= 0) {
    return Status(ErrorCode::kUnavailable, "mps: " + d.spec.resource_name +
                                               ": daemon started but wrote no pid to " + pid_file);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    d.pid = pid;
  }
  if (Status st = ApplyDefaults(d); !st.ok()) return st;
  spdlog::info("event=mps_daemon_started resource={} pid={} gpus={} thread_percentage={}",
               d.spec.resource_name, pid, Join(d.spec.gpu_uuids, ","),
               ActiveThreadPercentage(d.spec.replicas));
  return Status::Ok();
}

Status Supervisor::ApplyDefaults(Daemon& d) {
  std::vector<std::string> defaults{"set_default_active_thread_percentage " +
                                    std::to_string(ActiveThreadPercentage(d.spec.replicas))};
  for (size_t i = 0; i < d.spec.memory_bytes.size(); ++i) {
    if (d.spec.memory_bytes[i] == 0) continue;  // unknown size: no limit rather than a zero one
    defaults.push_back("set_default_device_pinned_mem_limit " + std::to_string(i) + " " +
                       PinnedMemLimit(d.spec.memory_bytes[i], d.spec.replicas));
  }
  Result<ControlOutput> set = RunControl(d, {}, defaults);
  if (!set.ok()) return set.status();
  if (set->exit_code != 0) {
    return Status(ErrorCode::kUnavailable,
                  "mps: " + d.spec.resource_name + ": setting defaults failed (exit " +
                      std::to_string(set->exit_code) + "): " + OneLine(set->out));
  }
  return Status::Ok();
}

bool Supervisor::AdoptDaemon(Daemon& d) {
  const int pid = ReadPidFile(PidFilePath(d.paths));
  if (!DaemonAlive(pid, d.paths.pipe_dir)) return false;
  const std::string visible = EnvironOf(pid, "CUDA_VISIBLE_DEVICES");
  if (visible != Join(d.spec.gpu_uuids, ",")) {
    spdlog::info("event=mps_daemon_replaced resource={} pid={} why=\"serves other GPUs ({})\"",
                 d.spec.resource_name, pid, visible);
    return false;
  }
  if (!CheckDaemon(d)) return false;
  // No record of the originals but the GPUs are exclusive already: an earlier gpulet set them.
  if (nvml_) {
    for (size_t i = 0; i < d.spec.gpu_uuids.size(); ++i) {
      nvmlDevice_t dev = nullptr;
      nvmlComputeMode_t mode{};
      if (saved_modes_.count(d.spec.gpu_uuids[i]) == 0 &&
          nvml_->fn().nvmlDeviceGetHandleByIndex_v2(d.spec.gpu_indices[i], &dev) == NVML_SUCCESS &&
          nvml_->fn().nvmlDeviceGetComputeMode(dev, &mode) == NVML_SUCCESS &&
          mode == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS) {
        spdlog::warn("event=mps_compute_mode_unknown uuid={} assumed=DEFAULT", d.spec.gpu_uuids[i]);
        saved_modes_[d.spec.gpu_uuids[i]] = {d.spec.gpu_indices[i], NVML_COMPUTEMODE_DEFAULT};
      }
    }
  }
  if (!SetExclusive(d).ok() || !ApplyDefaults(d).ok()) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    d.pid = pid;
  }
  spdlog::info("event=mps_daemon_adopted resource={} pid={} gpus={}", d.spec.resource_name, pid,
               visible);
  return true;
}

bool Supervisor::CheckDaemon(const Daemon& d) const {
  const int pid = ReadPidFile(PidFilePath(d.paths));
  if (!DaemonAlive(pid, d.paths.pipe_dir)) {
    spdlog::warn("event=mps_daemon_dead resource={} pid={}", d.spec.resource_name, pid);
    return false;
  }
  Result<ControlOutput> r = RunControl(d, {}, {"get_default_active_thread_percentage"});
  if (!r.ok() || r->exit_code != 0) {
    spdlog::warn("event=mps_daemon_unresponsive resource={} pid={} error=\"{}\"",
                 d.spec.resource_name, pid,
                 r.ok() ? "exit " + std::to_string(r->exit_code) + ": " + OneLine(r->out)
                        : r.status().message());
    return false;
  }
  return true;
}

void Supervisor::KillDaemon(Daemon& d) {
  int pid = ReadPidFile(PidFilePath(d.paths));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pid <= 0) pid = d.pid;
    d.pid = -1;
  }
  if (DaemonAlive(pid, d.paths.pipe_dir)) {
    // SIGTERM first (the daemon tells its servers to finish), SIGKILL after term_grace.
    if (!StopProcess(pid, options_.term_grace) ||
        !WaitUntilGone([&] { return DaemonAlive(pid, d.paths.pipe_dir); }, options_.stop_timeout)) {
      spdlog::error("event=mps_daemon_kill_failed resource={} pid={}", d.spec.resource_name, pid);
    }
  }
}

void Supervisor::QuitDaemon(Daemon& d) {
  const int pid = ReadPidFile(PidFilePath(d.paths));
  if (DaemonAlive(pid, d.paths.pipe_dir)) {
    Result<ControlOutput> r = RunControl(d, {}, {"quit"});
    if (!r.ok() || r->exit_code != 0) {
      spdlog::warn("event=mps_daemon_quit_failed resource={} pid={} action=kill",
                   d.spec.resource_name, pid);
    } else if (!WaitUntilGone([&] { return DaemonAlive(pid, d.paths.pipe_dir); },
                              options_.stop_timeout)) {
      spdlog::warn("event=mps_daemon_quit_timeout resource={} pid={} action=kill",
                   d.spec.resource_name, pid);
    }
  }
  KillDaemon(d);
}

Result<std::unique_ptr<Supervisor::Daemon>> Supervisor::MakeDaemon(DaemonSpec spec) const {
  auto d = std::make_unique<Daemon>();
  d->paths = PathsFor(options_.root, spec.resource_name);
  for (const std::string& dir : {d->paths.pipe_dir, d->paths.log_dir, d->paths.shm_dir}) {
    if (Status st = MakeDirs(dir, 0755); !st.ok()) {
      return Status(st.code(), "mps: root " + options_.root + ": " + st.message());
    }
  }
  const std::string bin_dir = binary_.substr(0, binary_.rfind('/'));
  d->env = {"CUDA_VISIBLE_DEVICES=" + Join(spec.gpu_uuids, ","),
            "CUDA_MPS_PIPE_DIRECTORY=" + d->paths.pipe_dir,
            "CUDA_MPS_LOG_DIRECTORY=" + d->paths.log_dir,
            "PATH=" + bin_dir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
  d->spec = std::move(spec);
  return d;
}

Status Supervisor::Start(std::vector<DaemonSpec> specs, HealthListener listener) {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_) return Status(ErrorCode::kInternal, "mps: Supervisor::Start called twice");
  }
  if (Status s = ValidateSpecs(specs); !s.ok()) return s;
  Result<std::string> binary = ResolveBinary(options_.control_binary);
  if (!binary.ok()) return binary.status();
  binary_ = *binary;

  std::vector<std::unique_ptr<Daemon>> daemons;
  for (DaemonSpec& s : specs) {
    Result<std::unique_ptr<Daemon>> d = MakeDaemon(std::move(s));
    if (!d.ok()) return d.status();
    daemons.push_back(std::move(*d));
  }
  // The originals an earlier gpulet recorded (it may have crashed with the GPUs exclusive).
  const std::string modes_path = ComputeModesPath(options_.root);
  Result<std::string> modes_text = ReadFileBounded(modes_path, 1u << 20);
  if (modes_text.ok()) {
    nlohmann::json j = nlohmann::json::parse(*modes_text, nullptr, false);
    if (j.is_object() && j.contains("modes") && j["modes"].is_object()) {
      for (const auto& [uuid, m] : j["modes"].items()) {
        if (m.is_object() && m.value("index", -1) >= 0 && m.contains("mode")) {
          saved_modes_[uuid] = {m.value("index", 0u), m.value("mode", 0)};
        }
      }
    } else {
      spdlog::error("event=mps_compute_modes_unreadable file={}", modes_path);
    }
  }

  {
    std::lock_guard<std::mutex> lock(mu_);
    daemons_ = std::move(daemons);
  }
  for (auto& d : daemons_) {
    // A healthy daemon for the same GPUs serves running pods: keep it. Anything else on this
    // pipe directory would make `-d` refuse to start.
    if (AdoptDaemon(*d)) continue;
    QuitDaemon(*d);
    Status s = StartDaemon(*d);
    if (!s.ok()) {
      for (auto& started : daemons_) QuitDaemon(*started);
      RestoreComputeModes();
      std::lock_guard<std::mutex> lock(mu_);
      daemons_.clear();
      return s;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto first = clock_.Now() + options_.health_interval;
    for (auto& d : daemons_) {
      d->healthy = true;
      d->next = first;
    }
    listener_ = std::move(listener);
    started_ = true;
    stopping_ = false;
  }
  StartLoop();
  return Status::Ok();
}

void Supervisor::StartLoop() {
  loop_stop_ = std::make_unique<StopSignal>();
  thread_ = std::thread([this, stop = loop_stop_.get()] { Loop(*stop); });
}

void Supervisor::StopLoop() {
  if (loop_stop_) loop_stop_->Stop();
  if (thread_.joinable()) thread_.join();
}

Status Supervisor::Update(std::vector<DaemonSpec> specs) {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopping_) return Status(ErrorCode::kInternal, "mps: Update before Start");
  }
  if (Status s = ValidateSpecs(specs); !s.ok()) return s;
  StopLoop();  // the daemons are ours alone until the loop runs again

  std::vector<std::unique_ptr<Daemon>> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::move(daemons_);
    daemons_.clear();
  }
  std::vector<std::unique_ptr<Daemon>> next;
  std::vector<Daemon*> fresh;
  Status first_error;
  std::set<std::string> used;
  for (DaemonSpec& spec : specs) {
    used.insert(spec.gpu_uuids.begin(), spec.gpu_uuids.end());
    auto same = std::find_if(old.begin(), old.end(), [&](const std::unique_ptr<Daemon>& d) {
      return d && SameSpec(d->spec, spec);
    });
    if (same != old.end()) {
      next.push_back(std::move(*same));  // unchanged: its pods keep their server
      continue;
    }
    Result<std::unique_ptr<Daemon>> d = MakeDaemon(std::move(spec));
    if (!d.ok()) {
      if (first_error.ok()) first_error = d.status();
      continue;
    }
    fresh.push_back(d->get());
    next.push_back(std::move(*d));
  }
  for (auto& d : old) {
    if (!d) continue;
    spdlog::info("event=mps_daemon_retired resource={}", d->spec.resource_name);
    QuitDaemon(*d);
  }
  RestoreComputeModes(used);
  std::vector<std::string> failed;
  for (Daemon* d : fresh) {
    Status s = StartDaemon(*d);
    const auto now = clock_.Now();
    std::lock_guard<std::mutex> lock(mu_);
    d->healthy = s.ok();
    d->down = !s.ok();
    d->failures = s.ok() ? 0 : 1;
    d->next = now + (s.ok() ? options_.health_interval : options_.min_backoff);
    if (!s.ok()) {
      failed.push_back(d->spec.resource_name);
      if (first_error.ok()) first_error = s;
    }
  }
  HealthListener listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    daemons_ = std::move(next);
    listener = listener_;
  }
  for (const std::string& name : failed) {
    if (listener) listener(name, false);
  }
  StartLoop();
  return first_error;
}

void Supervisor::Loop(StopSignal& stop) {
  while (!stop.stopped()) {
    gpulet::Clock::TimePoint wake = clock_.Now() + std::chrono::hours(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& d : daemons_) wake = std::min(wake, d->next);
    }
    if (!clock_.SleepUntil(wake, stop)) break;
    for (auto& dp : daemons_) {  // only Update changes the list, and it joins this thread first
      Daemon& d = *dp;
      if (stop.stopped()) break;
      if (clock_.Now() < d.next) continue;
      std::optional<bool> change;
      if (!d.down) {
        if (CheckDaemon(d)) {
          d.failures = 0;
        } else {
          d.down = true;
          ++d.failures;
          change = false;
          KillDaemon(d);
        }
      } else {
        Status s = StartDaemon(d);
        if (s.ok()) {
          d.down = false;
          change = true;
        } else {
          ++d.failures;
          spdlog::error("event=mps_daemon_restart_failed resource={} attempt={} error=\"{}\"",
                        d.spec.resource_name, d.failures, s.message());
          KillDaemon(d);
        }
      }
      if (d.down) {
        // min_backoff · 2^(failures-1), at most max_backoff. `failures` is reset only by a passed
        // check, so a daemon that dies right after each restart backs off too.
        milliseconds backoff = options_.min_backoff;
        for (int i = 1; i < d.failures && backoff < options_.max_backoff; ++i) backoff *= 2;
        backoff = std::min(backoff, options_.max_backoff);
        d.next = clock_.Now() + backoff;
        if (change) {
          spdlog::warn("event=mps_daemon_unhealthy resource={} restart_in_ms={}",
                       d.spec.resource_name, backoff.count());
        }
      } else {
        d.next = clock_.Now() + options_.health_interval;
      }
      if (change) {
        HealthListener listener;
        {
          std::lock_guard<std::mutex> l(mu_);
          d.healthy = *change;
          listener = listener_;
        }
        if (*change) spdlog::info("event=mps_daemon_healthy resource={}", d.spec.resource_name);
        if (listener) listener(d.spec.resource_name, *change);
      }
    }
  }
}

void Supervisor::Stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
  }
  StopLoop();
  for (auto& d : daemons_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      d->healthy = false;
    }
    QuitDaemon(*d);
    spdlog::info("event=mps_daemon_stopped resource={}", d->spec.resource_name);
  }
  RestoreComputeModes();
}

void Supervisor::Detach() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
  }
  StopLoop();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& d : daemons_) {
    d->healthy = false;
    spdlog::info("event=mps_daemon_detached resource={} pid={}", d->spec.resource_name, d->pid);
  }
}

bool Supervisor::Healthy(const std::string& resource_name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& d : daemons_) {
    if (d->spec.resource_name == resource_name) return d->healthy;
  }
  return false;
}

int Supervisor::DaemonPid(const std::string& resource_name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& d : daemons_) {
    if (d->spec.resource_name == resource_name) return d->pid;
  }
  return -1;
}

}  // namespace gpulet::mps
