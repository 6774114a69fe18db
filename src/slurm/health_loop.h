// The decision loop of `gpulet slurm health`: when to ask NodeDrainer to reconcile the node's
// drain state with the health board.
//
// Rules (Tick, called every `tick` by the command; time comes from the injected Clock):
// - The first decision waits two probe intervals, so a GPU that is still lost after a restart is
//   seen before a drain of ours gets resumed.
// - Then a new health version reconciles at the next tick; without one, the node is re-checked
//   every `resync` (an admin may have resumed it, slurmctld may have restarted).
// - A failed reconcile (scontrol missing, slurmctld down) is retried after min(resync, retry_cap).
// Each outcome is logged once when it changes (slurm_reconciled, slurm_reconcile_failed,
// slurm_admin_drain_kept).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/clock.h"
#include "gpu/health.h"
#include "slurm/drain.h"

namespace gpulet::slurm {

struct HealthLoopOptions {
  std::chrono::milliseconds probe_interval{1000};  // the health monitor's
  std::chrono::milliseconds resync{30000};
  std::chrono::milliseconds retry_cap{5000};
  std::chrono::milliseconds tick{200};  // how often the command calls Tick
};

class HealthLoop {
 public:
  // `drainer` and `board` must outlive the loop.
  HealthLoop(const NodeDrainer& drainer, const gpu::HealthBoard& board, const Clock& clock,
             HealthLoopOptions options);

  // Reconciles when due (see the rules above); the action taken, or nullopt when not due. A
  // failed reconcile returns its error.
  std::optional<Result<DrainAction>> Tick();

  uint64_t reconciles() const { return reconciles_; }

 private:
  const NodeDrainer& drainer_;
  const gpu::HealthBoard& board_;
  const Clock& clock_;
  HealthLoopOptions options_;
  Clock::TimePoint next_;
  uint64_t seen_ = 0;
  bool pending_ = true;
  std::string last_outcome_;
  uint64_t reconciles_ = 0;
};

}  // namespace gpulet::slurm
