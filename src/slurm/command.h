// Running Slurm's command-line clients (scontrol). The seam for tests: the drain and job logic
// talk to a CommandRunner, the real one spawns processes, tests script the answers.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"

namespace gpulet::slurm {

struct CommandOutput {
  int exit_code = 0;  // the process's exit status (128+N when killed by signal N)
  std::string out;    // stdout
  std::string err;    // stderr
};

class CommandRunner {
 public:
  virtual ~CommandRunner() = default;
  // Runs argv[0] (searched in PATH) with the rest as arguments; stdin is /dev/null.
  // Errors: kNotFound when the program does not exist, kUnavailable when it ran past `timeout`
  // (it is killed), kInternal when it could not be started. A non-zero exit is not an error.
  // Thread-safe.
  virtual Result<CommandOutput> Run(const std::vector<std::string>& argv,
                                    std::chrono::milliseconds timeout) const = 0;
};

// Spawns real processes (posix_spawnp).
class ProcessRunner : public CommandRunner {
 public:
  Result<CommandOutput> Run(const std::vector<std::string>& argv,
                            std::chrono::milliseconds timeout) const override;
};

}  // namespace gpulet::slurm
