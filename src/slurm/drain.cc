#include "slurm/drain.h"

#include <spdlog/spdlog.h>

namespace gpulet::slurm {

const char* DrainActionName(DrainAction a) {
  switch (a) {
    case DrainAction::kNone:
      return "none";
    case DrainAction::kDrained:
      return "drained";
    case DrainAction::kReasonUpdated:
      return "reason_updated";
    case DrainAction::kResumed:
      return "resumed";
    case DrainAction::kLeftAdminDrain:
      return "left_admin_drain";
  }
  return "?";
}

std::string DrainReason(const gpu::HealthSnapshot& snapshot) {
  std::string first;
  size_t unhealthy = 0;
  for (const auto& [uuid, health] : snapshot.devices) {  // std::map: sorted by UUID
    if (health.healthy) continue;
    if (unhealthy++ == 0) {
      std::string kind = uuid.rfind("MIG-", 0) == 0 ? "MIG device " : "GPU ";
      first = std::string(kReasonPrefix) + " " + kind + uuid + " " +
              (health.reason.empty() ? "unhealthy" : health.reason);
    }
  }
  if (unhealthy > 1) first += " (+" + std::to_string(unhealthy - 1) + " more)";
  return first;
}

Result<DrainAction> NodeDrainer::Reconcile(const gpu::HealthSnapshot& snapshot) const {
  const std::string want = DrainReason(snapshot);
  Result<NodeStatus> node = client_.ShowNode(node_);
  if (!node.ok()) return node.status();
  if (!want.empty()) {
    if (node->drained() && !node->ours()) {
      spdlog::warn("event=slurm_drain_skipped node={} reason=\"{}\" admin_reason=\"{}\"", node_,
                   want, node->reason);
      return DrainAction::kLeftAdminDrain;
    }
    if (node->drained() && node->reason == want) return DrainAction::kNone;
    bool update = node->drained();
    if (Status s = client_.Drain(node_, want); !s.ok()) return s;
    spdlog::warn("event={} node={} reason=\"{}\" state={}",
                 update ? "slurm_drain_reason_updated" : "slurm_drained", node_, want, node->state);
    return update ? DrainAction::kReasonUpdated : DrainAction::kDrained;
  }
  if (!node->drained()) return DrainAction::kNone;
  if (!node->ours()) return DrainAction::kLeftAdminDrain;
  if (Status s = client_.Resume(node_); !s.ok()) return s;
  spdlog::info("event=slurm_resumed node={} old_reason=\"{}\"", node_, node->reason);
  return DrainAction::kResumed;
}

}  // namespace gpulet::slurm
