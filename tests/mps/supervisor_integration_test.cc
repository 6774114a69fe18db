// The MPS supervisor against real processes: the nvidia-cuda-mps-control stand-in
// (testing/mps) and the simulated NVML driver on a dgx-h100. Every test has its own temp MPS
// root and simulation state, so tests run in parallel.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "gpu/nvml.h"
#include "mps/supervisor.h"
#include "sim/simulation.h"

namespace gpulet::mps {
namespace {

using namespace std::chrono_literals;

const std::string kStandIn = std::string(GPULET_BUILD_DIR) + "/mps/nvidia-cuda-mps-control";
const std::string kShared = "nvidia.com/gpu.shared";
const std::string kOther = "nvidia.com/gpu.mps-large";

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "gpulet-mps-it-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

// control.log without the "[timestamp] " prefixes.
std::vector<std::string> ControlLog(const DaemonPaths& p) {
  std::vector<std::string> out;
  for (const std::string& l : Lines(ReadFile(p.log_dir + "/control.log"))) {
    size_t sp = l.find("] ");
    out.push_back(sp == std::string::npos ? l : l.substr(sp + 2));
  }
  return out;
}

std::vector<std::string> Commands(const std::vector<std::string>& log) {
  std::vector<std::string> out;
  for (const std::string& l : log) {
    if (l.rfind("CMD ", 0) == 0) out.push_back(l.substr(4));
  }
  return out;
}

int ReadPid(const DaemonPaths& p) {
  std::string s = ReadFile(PidFilePath(p));
  return s.empty() ? -1 : std::atoi(s.c_str());
}

// Every process (any owner we may read) whose environment names `pipe_dir` as its MPS pipe
// directory, zombies excluded: the daemon and any client still running.
std::vector<int> ProcessesServing(const std::string& pipe_dir) {
  std::vector<int> out;
  const std::string want = "CUDA_MPS_PIPE_DIRECTORY=" + pipe_dir;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    const std::string base = std::string("/proc/") + e->d_name;
    std::string stat = ReadFile(base + "/stat");
    size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z') continue;
    std::string env = ReadFile(base + "/environ");
    size_t start = 0;
    while (start < env.size()) {
      size_t stop = env.find('\0', start);
      if (stop == std::string::npos) stop = env.size();
      if (env.compare(start, stop - start, want) == 0) {
        out.push_back(static_cast<int>(pid));
        break;
      }
      start = stop + 1;
    }
  }
  closedir(proc);
  return out;
}

bool WaitUntil(const std::function<bool()>& cond, std::chrono::milliseconds timeout = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// What the listener heard, in order.
class Events {
 public:
  void Add(const std::string& resource, bool healthy) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.emplace_back(resource, healthy);
    cv_.notify_all();
  }
  Supervisor::HealthListener Listener() {
    return [this](const std::string& r, bool h) { Add(r, h); };
  }
  // Waits until `resource` has had `count` events with value `healthy`.
  bool WaitFor(const std::string& resource, bool healthy, size_t count = 1) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, 60s, [&] { return CountLocked(resource, healthy) >= count; });
  }
  size_t Count(const std::string& resource, bool healthy) {
    std::lock_guard<std::mutex> lock(mu_);
    return CountLocked(resource, healthy);
  }
  std::vector<std::pair<std::string, bool>> All() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  size_t CountLocked(const std::string& resource, bool healthy) const {
    size_t n = 0;
    for (const auto& [r, h] : events_) n += (r == resource && h == healthy);
    return n;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, bool>> events_;
};

class MpsSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(access(kStandIn.c_str(), X_OK), 0) << kStandIn << " (build mps_control_standin)";
    dir_ = MakeTempDir();
    Result<sim::SimulatedNode> node = sim::PrepareSimulation("dgx-h100", dir_ + "/sim");
    ASSERT_TRUE(node.ok()) << node.status().message();
    Result<std::shared_ptr<gpu::Nvml>> nvml = gpu::Nvml::Load(node->library_path);
    ASSERT_TRUE(nvml.ok()) << nvml.status().message();
    nvml_ = *nvml;
    options_.control_binary = kStandIn;
    options_.root = dir_ + "/mps";
    options_.health_interval = 100ms;
    options_.min_backoff = 50ms;
    options_.max_backoff = 400ms;
    options_.command_timeout = 10s;  // python start-up on a loaded CI machine; hangs use less
    options_.stop_timeout = 10s;
  }

  nvmlDevice_t Handle(unsigned index) {
    nvmlDevice_t d = nullptr;
    EXPECT_EQ(nvml_->fn().nvmlDeviceGetHandleByIndex_v2(index, &d), NVML_SUCCESS);
    return d;
  }
  int ComputeMode(unsigned index) {
    nvmlComputeMode_t m{};
    EXPECT_EQ(nvml_->fn().nvmlDeviceGetComputeMode(Handle(index), &m), NVML_SUCCESS);
    return static_cast<int>(m);
  }
  DaemonSpec Spec(const std::string& name, const std::vector<unsigned>& indices, int replicas) {
    DaemonSpec s;
    s.resource_name = name;
    s.replicas = replicas;
    for (unsigned i : indices) {
      char uuid[96] = {};
      EXPECT_EQ(nvml_->fn().nvmlDeviceGetUUID(Handle(i), uuid, sizeof uuid), NVML_SUCCESS);
      nvmlMemory_t mem{};
      EXPECT_EQ(nvml_->fn().nvmlDeviceGetMemoryInfo(Handle(i), &mem), NVML_SUCCESS);
      s.gpu_uuids.push_back(uuid);
      s.gpu_indices.push_back(i);
      s.memory_bytes.push_back(mem.total);
    }
    return s;
  }
  DaemonPaths Paths(const std::string& name) { return PathsFor(options_.root, name); }

  std::string dir_;
  std::shared_ptr<gpu::Nvml> nvml_;
  SupervisorOptions options_;
  Events events_;
};

TEST_F(MpsSupervisorTest, StartsEachDaemonWithItsEnvironmentAndDefaults) {
  DaemonSpec shared = Spec(kShared, {2, 3}, 2);
  DaemonSpec other = Spec(kOther, {5}, 4);
  Supervisor sup(options_, nvml_);
  Status s = sup.Start({shared, other}, events_.Listener());
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(sup.Healthy(kShared));
  EXPECT_TRUE(sup.Healthy(kOther));
  EXPECT_FALSE(sup.Healthy("nvidia.com/gpu"));

  for (const auto& [spec, paths] : {std::pair{shared, Paths(kShared)}, {other, Paths(kOther)}}) {
    SCOPED_TRACE(spec.resource_name);
    std::vector<std::string> log = ControlLog(paths);
    ASSERT_FALSE(log.empty());
    std::string visible;
    for (const std::string& u : spec.gpu_uuids) visible += (visible.empty() ? "" : ",") + u;
    // Exactly the environment the supervisor chose: nothing of the test process leaks in.
    EXPECT_EQ(log[0], "START pid=" + std::to_string(ReadPid(paths)) +
                          " CUDA_VISIBLE_DEVICES=" + visible +
                          " ENV=CUDA_MPS_LOG_DIRECTORY,CUDA_MPS_PIPE_DIRECTORY,"
                          "CUDA_VISIBLE_DEVICES,PATH");
    EXPECT_EQ(sup.DaemonPid(spec.resource_name), ReadPid(paths));
    // Defaults: thread share, then a pinned-memory limit per device as the daemon numbers them.
    std::vector<std::string> want{"set_default_active_thread_percentage " +
                                  std::to_string(100 / spec.replicas)};
    for (size_t i = 0; i < spec.gpu_uuids.size(); ++i) {
      want.push_back("set_default_device_pinned_mem_limit " + std::to_string(i) + " " +
                     std::to_string(spec.memory_bytes[i] / spec.replicas / (1 << 20)) + "M");
    }
    std::vector<std::string> cmds = Commands(log);
    ASSERT_GE(cmds.size(), want.size());
    EXPECT_EQ(std::vector<std::string>(cmds.begin(), cmds.begin() + want.size()), want);
    // The pipe directory holds the control pipe; directories are 0755.
    struct stat st {};
    ASSERT_EQ(stat((paths.pipe_dir + "/control").c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));
    ASSERT_EQ(stat(paths.pipe_dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0755u);
    ASSERT_EQ(stat(paths.shm_dir.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
  }
  // 80 GiB H100 / 2 replicas: the daemon holds what it was told.
  Result<ControlOutput> q = sup.Control(
      kShared, {"get_default_device_pinned_mem_limit 1", "get_default_active_thread_percentage"});
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q->exit_code, 0);
  EXPECT_EQ(q->out, PinnedMemLimit(shared.memory_bytes[1], 2) + "\n50.0\n");
  sup.Stop();
  EXPECT_TRUE(events_.All().empty());  // no health change happened
}

TEST_F(MpsSupervisorTest, ExclusiveProcessWhileRunningPreviousModeRestoredAfter) {
  // GPU 3 starts PROHIBITED: Stop must put back what it found, not DEFAULT.
  ASSERT_EQ(nvml_->fn().nvmlDeviceSetComputeMode(Handle(3), NVML_COMPUTEMODE_PROHIBITED),
            NVML_SUCCESS);
  Supervisor sup(options_, nvml_);
  Status s = sup.Start({Spec(kShared, {2, 3}, 2)}, events_.Listener());
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ComputeMode(2), NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
  EXPECT_EQ(ComputeMode(3), NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
  EXPECT_EQ(ComputeMode(4), NVML_COMPUTEMODE_DEFAULT);  // not ours
  sup.Stop();
  EXPECT_EQ(ComputeMode(2), NVML_COMPUTEMODE_DEFAULT);
  EXPECT_EQ(ComputeMode(3), NVML_COMPUTEMODE_PROHIBITED);
  sup.Stop();  // idempotent
  EXPECT_EQ(ComputeMode(3), NVML_COMPUTEMODE_PROHIBITED);
}

TEST_F(MpsSupervisorTest, StopQuitsTheDaemonAndLeavesNoProcess) {
  Supervisor sup(options_, nvml_);
  ASSERT_TRUE(sup.Start({Spec(kShared, {0}, 3), Spec(kOther, {1}, 2)}, nullptr).ok());
  const int pid = ReadPid(Paths(kShared));
  ASSERT_GT(pid, 0);
  EXPECT_FALSE(ProcessesServing(Paths(kShared).pipe_dir).empty());
  sup.Stop();
  EXPECT_FALSE(sup.Healthy(kShared));
  EXPECT_EQ(sup.DaemonPid(kShared), -1);
  for (const std::string& r : {kShared, kOther}) {
    EXPECT_EQ(ProcessesServing(Paths(r).pipe_dir), std::vector<int>{}) << r;
    std::vector<std::string> log = ControlLog(Paths(r));
    ASSERT_GE(log.size(), 2u);
    EXPECT_EQ(log[log.size() - 2], "CMD quit") << r;  // asked politely, and it went
    EXPECT_EQ(log.back(), "QUIT") << r;
  }
  // Every child was reaped: this process has none left.
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST_F(MpsSupervisorTest, CrashedDaemonGoesUnhealthyIsRestartedWithDefaultsAndComesBack) {
  Supervisor sup(options_, nvml_);
  ASSERT_TRUE(sup.Start({Spec(kShared, {6, 7}, 4), Spec(kOther, {1}, 2)}, events_.Listener()).ok());
  const DaemonPaths paths = Paths(kShared);
  const int first = ReadPid(paths);
  ASSERT_GT(first, 0);
  ASSERT_EQ(kill(first, SIGKILL), 0);

  ASSERT_TRUE(events_.WaitFor(kShared, false)) << "no unhealthy event";
  ASSERT_TRUE(events_.WaitFor(kShared, true)) << "never came back";
  EXPECT_TRUE(sup.Healthy(kShared));
  std::vector<std::pair<std::string, bool>> all = events_.All();
  ASSERT_GE(all.size(), 2u);
  EXPECT_EQ(all[0], std::make_pair(kShared, false));  // down first, then up
  EXPECT_EQ(events_.Count(kOther, false), 0u);        // the other daemon was not disturbed

  const int second = ReadPid(paths);
  EXPECT_GT(second, 0);
  EXPECT_NE(second, first);
  EXPECT_EQ(sup.DaemonPid(kShared), second);
  // The new daemon was configured like the first: its log restarts with START and the defaults.
  std::vector<std::string> log = ControlLog(paths);
  size_t last_start = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].rfind("START ", 0) == 0) last_start = i;
  }
  ASSERT_GT(last_start, 0u) << "one START only";
  EXPECT_EQ(log[last_start].rfind("START pid=" + std::to_string(second) + " ", 0), 0u);
  std::vector<std::string> after =
      Commands(std::vector<std::string>(log.begin() + last_start, log.end()));
  ASSERT_GE(after.size(), 3u);
  EXPECT_EQ(after[0], "set_default_active_thread_percentage 25");
  EXPECT_EQ(after[1].rfind("set_default_device_pinned_mem_limit 0 ", 0), 0u) << after[1];
  EXPECT_EQ(after[2].rfind("set_default_device_pinned_mem_limit 1 ", 0), 0u) << after[2];
  Result<ControlOutput> q = sup.Control(kShared, {"get_default_active_thread_percentage"});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->out, "25.0\n");
  EXPECT_EQ(ComputeMode(6), NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);

  sup.Stop();
  EXPECT_EQ(ProcessesServing(paths.pipe_dir), std::vector<int>{});
  EXPECT_EQ(ComputeMode(6), NVML_COMPUTEMODE_DEFAULT);
}

TEST_F(MpsSupervisorTest, HungDaemonCountsAsUnhealthyAndIsReplaced) {
  options_.command_timeout = 2s;
  Supervisor sup(options_, nvml_);
  ASSERT_TRUE(sup.Start({Spec(kShared, {0}, 2)}, events_.Listener()).ok());
  const DaemonPaths paths = Paths(kShared);
  const int hung = ReadPid(paths);
  ASSERT_GT(hung, 0);
  ASSERT_EQ(kill(hung, SIGSTOP), 0);  // alive, holding its pipe, answering nothing

  ASSERT_TRUE(events_.WaitFor(kShared, false)) << "a stopped daemon was not noticed";
  ASSERT_TRUE(events_.WaitFor(kShared, true)) << "never replaced";
  EXPECT_TRUE(sup.Healthy(kShared));
  const int replacement = ReadPid(paths);
  EXPECT_NE(replacement, hung);
  // The hung one was killed, not left behind.
  EXPECT_EQ(ProcessesServing(paths.pipe_dir), std::vector<int>{replacement});
  sup.Stop();
  EXPECT_EQ(ProcessesServing(paths.pipe_dir), std::vector<int>{});
}

TEST_F(MpsSupervisorTest, RestartFailuresBackOffUntilTheDaemonCanStartAgain) {
  // A private copy of the control program that the test can break and repair.
  const std::string bin = dir_ + "/bin/nvidia-cuda-mps-control";
  ASSERT_EQ(mkdir((dir_ + "/bin").c_str(), 0755), 0);
  const std::string standin = ReadFile(kStandIn);
  auto write_bin = [&](const std::string& text) {
    const std::string tmp = bin + ".tmp";
    std::ofstream(tmp) << text;
    chmod(tmp.c_str(), 0755);
    ASSERT_EQ(rename(tmp.c_str(), bin.c_str()), 0);
  };
  write_bin(standin);
  options_.control_binary = bin;
  Supervisor sup(options_, nvml_);
  ASSERT_TRUE(sup.Start({Spec(kShared, {0}, 2)}, events_.Listener()).ok());
  const DaemonPaths paths = Paths(kShared);

  // Break it: every start attempt now fails and leaves a mark.
  const std::string attempts = dir_ + "/attempts";
  write_bin("#!/bin/sh\necho attempt >> " + attempts + "\necho 'cannot start' >&2\nexit 1\n");
  ASSERT_EQ(kill(ReadPid(paths), SIGKILL), 0);
  ASSERT_TRUE(events_.WaitFor(kShared, false));
  ASSERT_TRUE(WaitUntil([&] { return Lines(ReadFile(attempts)).size() >= 3; }))
      << "restart was not retried";
  EXPECT_FALSE(sup.Healthy(kShared));
  EXPECT_EQ(events_.Count(kShared, true), 0u);

  write_bin(standin);  // repaired: the next attempt succeeds
  ASSERT_TRUE(events_.WaitFor(kShared, true));
  EXPECT_TRUE(sup.Healthy(kShared));
  EXPECT_EQ(events_.Count(kShared, false), 1u);  // failed retries are not repeated as events
  sup.Stop();
  EXPECT_EQ(ProcessesServing(paths.pipe_dir), std::vector<int>{});
}

TEST_F(MpsSupervisorTest, DaemonLeftByAnEarlierRunIsReplaced) {
  const DaemonPaths paths = Paths(kShared);
  // An earlier gpulet's daemon, same pipe directory, other GPUs.
  ASSERT_EQ(
      system(("mkdir -p " + paths.pipe_dir + " " + paths.log_dir +
              " && env -i PATH=/usr/bin:/bin CUDA_VISIBLE_DEVICES=GPU-old"
              " CUDA_MPS_PIPE_DIRECTORY=" +
              paths.pipe_dir + " CUDA_MPS_LOG_DIRECTORY=" + paths.log_dir + " " + kStandIn + " -d")
                 .c_str()),
      0);
  const int old = ReadPid(paths);
  ASSERT_GT(old, 0);
  Supervisor sup(options_, nvml_);
  Status s = sup.Start({Spec(kShared, {0}, 2)}, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  const int now = ReadPid(paths);
  EXPECT_NE(now, old);
  EXPECT_EQ(ProcessesServing(paths.pipe_dir), std::vector<int>{now});
  sup.Stop();
}

TEST_F(MpsSupervisorTest, ConcurrentClientsAreAllAnswered) {
  Supervisor sup(options_, nvml_);
  ASSERT_TRUE(sup.Start({Spec(kShared, {0}, 2)}, nullptr).ok());
  constexpr int kClients = 12;
  std::vector<std::thread> threads;
  std::vector<std::string> replies(kClients);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      const std::string idx = std::to_string(100 + i);
      Result<ControlOutput> r =
          sup.Control(kShared, {"set_default_device_pinned_mem_limit " + idx + " " + idx + "M",
                                "get_default_device_pinned_mem_limit " + idx});
      replies[i] = r.ok() ? r->out : "error: " + r.status().message();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(replies[i], std::to_string(100 + i) + "M\n") << i;
  std::vector<std::string> cmds = Commands(ControlLog(Paths(kShared)));
  for (int i = 0; i < kClients; ++i) {
    const std::string idx = std::to_string(100 + i);
    EXPECT_NE(std::find(cmds.begin(), cmds.end(),
                        "set_default_device_pinned_mem_limit " + idx + " " + idx + "M"),
              cmds.end())
        << i;
  }
  sup.Stop();
}

}  // namespace
}  // namespace gpulet::mps

namespace gpulet::mps {
namespace {

// A gpulet that dies without Stop (crash, SIGKILL, OOM): a child process starts a supervisor
// and exits at once, leaving its daemons running and the GPUs EXCLUSIVE_PROCESS.
void StartThenCrash(const SupervisorOptions& options, const std::shared_ptr<gpu::Nvml>& nvml,
                    const std::vector<DaemonSpec>& specs) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto* sup = new Supervisor(options, nvml);  // never destroyed: no Stop, as in a crash
    _exit(sup->Start(specs, nullptr).ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the first gpulet did not start";
}

TEST_F(MpsSupervisorTest, AfterACrashTheTrueOriginalComputeModeIsRestored) {
  ASSERT_EQ(nvml_->fn().nvmlDeviceSetComputeMode(Handle(3), NVML_COMPUTEMODE_PROHIBITED),
            NVML_SUCCESS);
  StartThenCrash(options_, nvml_, {Spec(kShared, {2, 3}, 2)});
  ASSERT_EQ(ComputeMode(3), NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);  // left as the crash left it
  Supervisor sup(options_, nvml_);
  ASSERT_TRUE(sup.Start({Spec(kShared, {2, 3}, 2)}, nullptr).ok());
  sup.Stop();
  EXPECT_EQ(ComputeMode(2), NVML_COMPUTEMODE_DEFAULT);
  EXPECT_EQ(ComputeMode(3), NVML_COMPUTEMODE_PROHIBITED);  // not the EXCLUSIVE_PROCESS it found
  EXPECT_EQ(access(ComputeModesPath(options_.root).c_str(), F_OK), -1);  // nothing left to restore
}

TEST_F(MpsSupervisorTest, ARestartedGpuletAdoptsTheHealthyDaemonOfRunningPods) {
  StartThenCrash(options_, nvml_, {Spec(kShared, {0}, 2), Spec(kOther, {1}, 2)});
  const DaemonPaths paths = Paths(kShared);
  const int before = ReadPid(paths);
  ASSERT_GT(before, 0);
  Supervisor sup(options_, nvml_);
  // kOther now wants other GPUs: its daemon is replaced; kShared's is kept.
  ASSERT_TRUE(sup.Start({Spec(kShared, {0}, 2), Spec(kOther, {4}, 2)}, nullptr).ok());
  EXPECT_EQ(ReadPid(paths), before);
  EXPECT_EQ(sup.DaemonPid(kShared), before);
  EXPECT_EQ(ProcessesServing(paths.pipe_dir), std::vector<int>{before});
  for (const std::string& line : ControlLog(paths)) EXPECT_NE(line, "CMD quit");
  EXPECT_NE(ReadPid(Paths(kOther)), -1);
  EXPECT_EQ(ComputeMode(1), NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);  // the crash's, not restored yet
  sup.Stop();
  EXPECT_EQ(ProcessesServing(paths.pipe_dir), std::vector<int>{});
}

TEST_F(MpsSupervisorTest, UpdateRestartsOnlyTheDaemonWhoseResourceChanged) {
  Supervisor sup(options_, nvml_);
  ASSERT_TRUE(sup.Start({Spec(kShared, {0}, 2), Spec(kOther, {1}, 2)}, events_.Listener()).ok());
  const int shared = ReadPid(Paths(kShared));
  const int other = ReadPid(Paths(kOther));
  Status s = sup.Update({Spec(kShared, {0}, 2), Spec(kOther, {1}, 4)});
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadPid(Paths(kShared)), shared);  // untouched
  EXPECT_NE(ReadPid(Paths(kOther)), other);    // replicas changed: restarted
  EXPECT_TRUE(sup.Healthy(kShared));
  EXPECT_TRUE(sup.Healthy(kOther));
  // A resource that goes away is quit and its GPU gets its mode back.
  ASSERT_TRUE(sup.Update({Spec(kShared, {0}, 2)}).ok());
  EXPECT_EQ(ReadPid(Paths(kShared)), shared);
  EXPECT_EQ(ProcessesServing(Paths(kOther).pipe_dir), std::vector<int>{});
  EXPECT_EQ(ComputeMode(1), NVML_COMPUTEMODE_DEFAULT);
  EXPECT_FALSE(sup.Healthy(kOther));
  EXPECT_TRUE(events_.All().empty());
  sup.Stop();
}

TEST_F(MpsSupervisorTest, AnUnresponsiveDaemonIsAskedToTerminateBeforeItIsKilled) {
  options_.command_timeout = 2s;
  Supervisor sup(options_, nvml_);
  ASSERT_TRUE(sup.Start({Spec(kShared, {0}, 2)}, events_.Listener()).ok());
  const DaemonPaths paths = Paths(kShared);
  const int hung = ReadPid(paths);
  EXPECT_FALSE(sup.Control(kShared, {"debug_hang"}).ok());  // alive, answering nothing
  ASSERT_TRUE(events_.WaitFor(kShared, false));
  ASSERT_TRUE(events_.WaitFor(kShared, true));
  EXPECT_NE(ReadPid(paths), hung);
  std::vector<std::string> log = ControlLog(paths);
  auto hang = std::find(log.begin(), log.end(), "CMD debug_hang");
  ASSERT_NE(hang, log.end());
  EXPECT_NE(std::find(hang, log.end(), "TERM"), log.end()) << "killed without a SIGTERM first";
  sup.Stop();
}

// Detach leaves the daemons and modes for the next gpulet (an upgrade); it adopts them.
TEST_F(MpsSupervisorTest, DetachLeavesTheDaemonsForTheNextGpulet) {
  const DaemonPaths paths = Paths(kShared);
  int pid = -1;
  {
    Supervisor first(options_, nvml_);
    ASSERT_TRUE(first.Start({Spec(kShared, {0}, 2)}, nullptr).ok());
    pid = ReadPid(paths);
    first.Detach();
  }  // destroyed: Stop after Detach does nothing
  EXPECT_EQ(ProcessesServing(paths.pipe_dir), std::vector<int>{pid});
  EXPECT_EQ(ComputeMode(0), NVML_COMPUTEMODE_EXCLUSIVE_PROCESS);
  Supervisor next(options_, nvml_);
  ASSERT_TRUE(next.Start({Spec(kShared, {0}, 2)}, nullptr).ok());
  EXPECT_EQ(ReadPid(paths), pid);
  next.Stop();
  EXPECT_EQ(ComputeMode(0), NVML_COMPUTEMODE_DEFAULT);
}

}  // namespace
}  // namespace gpulet::mps

namespace gpulet::mps {
namespace {

int Checks(const DaemonPaths& p) {
  int n = 0;
  for (const std::string& c : Commands(ControlLog(p))) {
    n += c == "get_default_active_thread_percentage" ? 1 : 0;
  }
  return n;
}

// Health checks run on the injected clock: none before the interval, one per interval.
TEST_F(MpsSupervisorTest, HealthChecksFollowTheInjectedClock) {
  FakeClock clock;
  options_.health_interval = std::chrono::seconds(10);
  Supervisor sup(options_, nvml_, clock);
  ASSERT_TRUE(sup.Start({Spec(kShared, {0}, 2)}, events_.Listener()).ok());
  const DaemonPaths paths = Paths(kShared);
  ASSERT_TRUE(clock.WaitForSleepers(1));
  EXPECT_EQ(Checks(paths), 0);
  clock.Advance(std::chrono::seconds(9));
  ASSERT_TRUE(clock.WaitForSleepers(1));
  EXPECT_EQ(Checks(paths), 0);  // not yet: 9 s of 10
  clock.Advance(std::chrono::seconds(1));
  ASSERT_TRUE(WaitUntil([&] { return Checks(paths) == 1; }));
  ASSERT_TRUE(WaitUntil([&] { return clock.sleepers() == 1; }));
  EXPECT_EQ(Checks(paths), 1);
  clock.Advance(std::chrono::seconds(10));
  ASSERT_TRUE(WaitUntil([&] { return Checks(paths) == 2; }));
  sup.Stop();
  EXPECT_TRUE(events_.All().empty());
}

}  // namespace
}  // namespace gpulet::mps
