#include "slurm/health_loop.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace gpulet::slurm {

HealthLoop::HealthLoop(const NodeDrainer& drainer, const gpu::HealthBoard& board,
                       const Clock& clock, HealthLoopOptions options)
    : drainer_(drainer),
      board_(board),
      clock_(clock),
      options_(options),
      next_(clock.Now() + 2 * options.probe_interval) {}

std::optional<Result<DrainAction>> HealthLoop::Tick() {
  gpu::HealthSnapshot snap = board_.Current();
  if (snap.version != seen_) pending_ = true;
  const Clock::TimePoint now = clock_.Now();
  if (now < next_ || (!pending_ && now < next_ + options_.resync)) return std::nullopt;
  Result<DrainAction> a = drainer_.Reconcile(snap);
  ++reconciles_;
  const std::string& node = drainer_.node_name();
  std::string outcome = a.ok() ? DrainActionName(*a) : a.status().message();
  if (a.ok() && (snap.version != seen_ || outcome != last_outcome_)) {
    size_t unhealthy = 0;
    for (const auto& [uuid, h] : snap.devices) unhealthy += h.healthy ? 0 : 1;
    spdlog::info("event=slurm_reconciled node={} health_version={} unhealthy={} action={}", node,
                 snap.version, unhealthy, outcome);
  }
  if (!a.ok() && outcome != last_outcome_) {
    spdlog::error("event=slurm_reconcile_failed node={} error=\"{}\"", node, outcome);
  } else if (a.ok() && *a == DrainAction::kLeftAdminDrain && outcome != last_outcome_) {
    spdlog::warn("event=slurm_admin_drain_kept node={} unhealthy_reason=\"{}\"", node,
                 DrainReason(snap));
  }
  last_outcome_ = outcome;
  seen_ = snap.version;
  pending_ = !a.ok();
  next_ = clock_.Now();
  if (!a.ok()) next_ += std::min(options_.resync, options_.retry_cap);
  return a;
}

}  // namespace gpulet::slurm
