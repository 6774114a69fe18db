// The broker's Slurm adapter: reads nodes (`sinfo --json`), jobs (`squeue --json`) and
// reservations (`scontrol show reservation -o`) through a CommandRunner, and drains/resumes.
//
// Fail closed: any failed command, non-JSON output, an "errors" entry in the JSON or a field of
// the wrong type makes the whole view not ok (with the command and problem in `error`); the engine
// then does nothing.
//
// Resume is guarded: a fresh `scontrol show node` must show DRAIN with a reason that still starts
// with "gpulet-broker:", otherwise nothing is resumed (an admin's drain stays). Drains use
// State=DRAIN, never DOWN (ReturnToService would undo a DOWN).
#pragma once

#include <memory>
#include <string>

#include "broker/config.h"
#include "broker/model.h"
#include "common/status.h"
#include "slurm/command.h"
#include "slurm/scontrol.h"

namespace gpulet::broker {

// Parsers, exposed for tests and the benchmark. `source` names the input in errors.
Result<std::map<std::string, SlurmNode>> ParseSinfoJson(const std::string& text, TimeMs now);
Result<std::vector<SlurmJob>> ParseSqueueJson(const std::string& text);
// `scontrol show reservation -o` (times are local time, as scontrol prints them).
Result<std::vector<Reservation>> ParseReservations(const std::string& text);
// "gres:gpu:h100:4" / "gres:gpu:4" / "gpu:h100:4(S:0-1),shard:…" → the gpu count (0 when none).
int GpuCount(const std::string& tres_or_gres);
// The same by type, lower case: "gpu:h100:4,gpu:1g.10gb:7" → {h100: 4, 1g.10gb: 7}; "gpu:2" →
// {"": 2}; "gres/gpu:l4=2" → {l4: 2}.
std::map<std::string, int> GpusByType(const std::string& tres_or_gres);

class SlurmSide {
 public:
  SlurmSide(std::shared_ptr<const slurm::CommandRunner> runner, const BrokerConfig& config);

  SlurmView Observe(TimeMs now) const;
  Status Drain(const std::string& node, const std::string& reason) const;
  // RESUME only when DRAIN with our reason (fresh read): one that starts with `prefix`
  // (kScaleDownReasonPrefix in the Slurm-on-Kubernetes mode). Returns whether it resumed.
  Result<bool> ResumeIfOurs(const std::string& node,
                            const std::string& prefix = kBrokerReasonPrefix) const;

 private:
  Result<std::string> RunJson(const std::vector<std::string>& argv) const;

  std::shared_ptr<const slurm::CommandRunner> runner_;
  const BrokerConfig& config_;
  slurm::SlurmClient client_;
};

}  // namespace gpulet::broker
