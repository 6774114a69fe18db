// The few slurmctld conversations gpulet needs, through `scontrol` (Debian ships no libslurm
// headers we could rely on, and scontrol's one-line output is stable across 20.x–23.x).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "slurm/command.h"

namespace gpulet::slurm {

// The prefix of every drain reason gpulet sets. A drained node whose reason does not start with
// it was drained by someone else, and gpulet never resumes it.
inline constexpr const char* kReasonPrefix = "gpulet:";

struct NodeStatus {
  std::string name;
  std::string state;              // "IDLE+DRAIN", "MIXED", "DOWN+NOT_RESPONDING", …
  std::string reason;             // without Slurm's " [user@time]" suffix; empty when none
  std::string slurmd_start_time;  // SlurmdStartTime as scontrol prints it; "None" or empty: none
  bool drained() const;           // DRAIN flag set (draining or drained)
  bool ours() const;              // reason starts with kReasonPrefix
};

// Parses one node of `scontrol show node -o <name>`. Errors (kInvalidInput) when NodeName or
// State is missing.
Result<NodeStatus> ParseNodeStatus(const std::string& oneliner);

class SlurmClient {
 public:
  // `scontrol`: program name or path.
  SlurmClient(std::shared_ptr<const CommandRunner> runner, std::string scontrol = "scontrol",
              std::chrono::milliseconds timeout = std::chrono::seconds(15));

  // Errors: kNotFound (scontrol missing, or no such node), kUnavailable (slurmctld not
  // reachable or not answering), kInternal (anything else scontrol reports, quoted).
  Result<NodeStatus> ShowNode(const std::string& node) const;
  Status Drain(const std::string& node, const std::string& reason) const;
  Status Resume(const std::string& node) const;
  // `scontrol show job -d -o`: every job, one line each, with per-node GRES index data.
  Result<std::string> ShowJobsDetail() const;

 private:
  Result<CommandOutput> Call(const std::vector<std::string>& args) const;

  std::shared_ptr<const CommandRunner> runner_;
  std::string scontrol_;
  std::chrono::milliseconds timeout_;
};

}  // namespace gpulet::slurm
