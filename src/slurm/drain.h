// Health into Slurm: keeps a node's drain state in line with its GPUs' health.
//
// Rules (Reconcile):
// - Some GPU or MIG device unhealthy → the node is drained with reason
//   "gpulet: GPU <uuid> <why>[ (+N more)]". Already drained with our reason → the reason is
//   updated when it changed, otherwise nothing. Drained by someone else (reason not starting with
//   "gpulet:") → left alone: their drain already keeps jobs off, and their reason stays.
// - Every device healthy → the node is resumed only if it is drained with a reason that still
//   starts with "gpulet:". An admin's drain is never undone.
// - scontrol failing (missing, slurmctld down) → the error is returned and nothing is changed;
//   the caller retries on its next tick.
#pragma once

#include <string>

#include "common/status.h"
#include "gpu/health.h"
#include "slurm/scontrol.h"

namespace gpulet::slurm {

// What Reconcile did.
enum class DrainAction { kNone, kDrained, kReasonUpdated, kResumed, kLeftAdminDrain };
const char* DrainActionName(DrainAction a);

// The reason for a snapshot's unhealthy devices ("" when all are healthy). Deterministic: the
// first unhealthy UUID in sorted order is named.
std::string DrainReason(const gpu::HealthSnapshot& snapshot);

class NodeDrainer {
 public:
  NodeDrainer(const SlurmClient& client, std::string node_name)
      : client_(client), node_(std::move(node_name)) {}

  Result<DrainAction> Reconcile(const gpu::HealthSnapshot& snapshot) const;
  const std::string& node_name() const { return node_; }

 private:
  const SlurmClient& client_;
  std::string node_;
};

}  // namespace gpulet::slurm
