// MpsControl (node_preparer.h) through mps::Supervisor: one nvidia-cuda-mps-control daemon per
// MPS-configured claim, resource name "gpu.gpulet.io/claim-<uid>", pipe and shm directories from
// mps::PathsFor(root, that name). Its GPUs go to EXCLUSIVE_PROCESS while it runs (the
// supervisor's rule) and back when the claim is unprepared.
//
// Defaults: the supervisor derives them from a replica count; the config's values are given as
// replicas = 100 / percentage (1 when unset) and memory = pinned limit × replicas (the GPU's
// memory × replicas when unset), then set exactly through the control pipe
// (set_default_active_thread_percentage, set_default_device_pinned_mem_limit). A daemon the
// supervisor restarts after a failed health check gets the replica-derived values, which equal
// the config's whenever the percentage divides 100.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "dra/node_preparer.h"
#include "gpu/nvml.h"
#include "mps/supervisor.h"

namespace gpulet::dra {

class SupervisorMpsControl final : public MpsControl {
 public:
  // Starts the supervisor with no daemon. Errors as mps::Supervisor::Start.
  static Result<std::shared_ptr<SupervisorMpsControl>> Create(mps::SupervisorOptions options,
                                                              std::shared_ptr<gpu::Nvml> nvml);
  ~SupervisorMpsControl() override;

  Result<MpsDaemonDirs> Start(const MpsRequest& request) override;
  Status Stop(const std::string& claim_uid) override;

  static std::string ResourceName(const std::string& claim_uid);

 private:
  SupervisorMpsControl(mps::SupervisorOptions options, std::shared_ptr<gpu::Nvml> nvml);
  std::vector<mps::DaemonSpec> Specs() const;

  std::string root_;
  std::unique_ptr<mps::Supervisor> supervisor_;
  std::mutex mu_;
  std::map<std::string, mps::DaemonSpec> specs_;  // by claim UID
};

}  // namespace gpulet::dra
