// Processes as a seam: the one way gpulet runs a command (scontrol, nvidia-cuda-mps-control, …) and
// the one way it stops a process it started or adopted. Children always start clean: default
// signal dispositions, an empty signal mask (gpulet blocks SIGTERM/SIGINT/SIGHUP in every thread
// to receive them with sigtimedwait; a child must not inherit that), stdin from /dev/null or the
// given bytes, and no descriptor of ours beyond 0–2.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace gpulet {

struct CommandSpec {
  std::vector<std::string> argv;  // argv[0] is searched in PATH unless it contains '/'
  std::optional<std::vector<std::string>> env;  // "K=V" entries; nullopt inherits ours
  std::string stdin_data;                       // the child's whole stdin
  bool merge_stderr = false;                    // stderr into `out`, as 2>&1
  std::chrono::milliseconds timeout{30'000};
  size_t max_output = 1u << 20;  // per stream; the rest is read and dropped (`truncated` says so)
  // true: collect output until the child exits AND its streams close. false: stop reading once
  // the child has exited (for a client that forks a daemon which keeps the pipe open).
  bool wait_for_eof = true;
};

struct CommandOutput {
  int exit_code = 0;  // the exit status; 128+N when killed by signal N
  std::string out;
  std::string err;
  bool truncated = false;  // some output beyond max_output was dropped
};

// Runs the command and waits for it. Errors: kNotFound when the program does not exist,
// kUnavailable when it ran past the timeout (it is killed and reaped first), kInternal when it
// could not be started or polling its output failed (it is killed and reaped: never a blocking wait
// on a child that may not end). A non-zero exit is not an error. Thread-safe.
Result<CommandOutput> RunCommand(const CommandSpec& spec);

// The seam for code that runs commands: production uses ProcessRunner::Real(), tests script it.
class ProcessRunner {
 public:
  virtual ~ProcessRunner() = default;
  virtual Result<CommandOutput> Run(const CommandSpec& spec) const = 0;
  static const ProcessRunner& Real();
};

// Starts a long-lived child (a daemon it supervises) with the clean start described above, its
// stdout and stderr appended to `log_path` (or /dev/null when empty). Returns its pid; the caller
// reaps it (waitpid) or stops it with StopProcess.
Result<pid_t> SpawnProcess(const std::vector<std::string>& argv,
                           const std::optional<std::vector<std::string>>& env,
                           const std::string& log_path);

// True while `pid` exists and is not a zombie.
bool ProcessAlive(pid_t pid);

// Stops `pid`: SIGTERM, then up to `grace` (on `clock`) for it to exit, then SIGKILL and up to
// `grace` again. Reaps it when it is our child. Returns true once it is gone.
bool StopProcess(pid_t pid, std::chrono::milliseconds grace, Clock& clock = RealClock());

}  // namespace gpulet
