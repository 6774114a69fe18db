// Running Slurm's command-line clients (scontrol, sinfo, squeue). The seam for tests: the drain
// and job logic talk to a CommandRunner, the real one runs processes through common/process.h
// (clean signal mask, bounded output, killed and reaped on timeout), tests script the answers.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/status.h"

namespace gpulet::slurm {

// exit_code, out, err (and `truncated` when an answer ran past the output bound).
using CommandOutput = ::gpulet::CommandOutput;

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

// Real processes, through gpulet::RunCommand. Output is bounded at kMaxOutput per stream (the
// largest squeue --json of a busy cluster is a few MiB).
class ProcessRunner : public CommandRunner {
 public:
  static constexpr size_t kMaxOutput = 32u << 20;
  Result<CommandOutput> Run(const std::vector<std::string>& argv,
                            std::chrono::milliseconds timeout) const override;
};

}  // namespace gpulet::slurm
