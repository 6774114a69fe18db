// Test support: runs the real gpulet binary (build/gpulet) as a child process on a simulated node,
// in a private temporary directory, next to a kubelet harness.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace gpulet::testing {

// A fresh directory under /tmp, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// $GPULET_BUILD_DIR/gpulet, else the build directory compiled in.
std::string GpuletBinary();

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal or timed out
  std::string output;  // stdout + stderr
};
// Runs gpulet with `args` to completion (killed after `timeout`).
RunResult RunGpulet(const std::vector<std::string>& args,
                    std::chrono::seconds timeout = std::chrono::seconds(60),
                    const std::map<std::string, std::string>& env = {});

// A long-running gpulet (e.g. `gpulet plugin`) with its output in a log file.
class GpuletProcess {
 public:
  GpuletProcess(std::vector<std::string> args, std::string log_path,
                std::map<std::string, std::string> env = {});
  ~GpuletProcess();  // SIGKILLs a process still running
  GpuletProcess(const GpuletProcess&) = delete;
  GpuletProcess& operator=(const GpuletProcess&) = delete;

  bool Start();
  // Sends `sig` and waits up to `timeout` for the exit; returns the exit code, or -1 if it was
  // killed by a signal or did not exit in time (then it is SIGKILLed).
  int Stop(int sig, std::chrono::seconds timeout = std::chrono::seconds(30));
  void Signal(int sig) const;
  bool Running();
  // Waits until the log contains `text` `times` times (true) or `timeout` passes (false).
  bool WaitForLog(const std::string& text, std::chrono::milliseconds timeout, int times = 1) const;
  int CountInLog(const std::string& text) const;
  std::string Log() const;
  pid_t pid() const { return pid_; }

 private:
  std::vector<std::string> args_;
  std::string log_path_;
  std::map<std::string, std::string> env_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

// The port `gpulet node` (started with -a 127.0.0.1:0) serves /metrics on: waits for its
// event=listening line and reads the port from it. -1 when none came within `timeout`.
int ListeningPort(const GpuletProcess& node, std::chrono::milliseconds timeout);

// Polls `pred` every 20 ms until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout);

}  // namespace gpulet::testing
