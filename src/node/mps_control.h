// Keeps one mps::Supervisor serving the plan's MPS resources, and their health on the board
// (deviceplugin::MpsHealthKey). A change of the MPS resources updates the running supervisor:
// only the daemons whose resource changed are restarted, the others keep serving their pods. The
// supervisor is replaced only when the MPS root changes. At exit the daemons are either handed
// over (Detach: the next gpulet adopts them, so pods keep their MPS servers across a restart or
// an upgrade) or quit (Stop: MPS turned off, or the operator asked for it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "gpu/health.h"
#include "gpu/inventory.h"
#include "sharing/plan.h"

namespace gpulet::gpu {
class Nvml;
}
namespace gpulet::mps {
class Supervisor;
}

namespace gpulet::node {

// Not thread-safe: called from one thread at a time (start-up, then the plugin manager's loader,
// then shutdown).
class MpsControl {
 public:
  MpsControl(std::string control_binary, std::shared_ptr<gpu::Nvml> nvml, gpu::HealthBoard& board);
  ~MpsControl();  // Stop()s
  MpsControl(const MpsControl&) = delete;
  MpsControl& operator=(const MpsControl&) = delete;

  // (Re)starts the supervisor when the MPS part of `plan` changed. On failure the resources stay
  // advertised, Unhealthy, and the error is returned.
  Status Apply(const sharing::Plan& plan, const gpu::Inventory& inventory, const std::string& root);
  // Quits every daemon and restores compute modes.
  void Stop();
  // Leaves the daemons running and the compute modes as they are, for the next gpulet to adopt.
  void Detach();

 private:
  const std::string control_binary_;
  std::shared_ptr<gpu::Nvml> nvml_;
  gpu::HealthBoard& board_;
  std::string key_;
  std::string root_;
  std::vector<std::string> resources_;
  std::unique_ptr<mps::Supervisor> supervisor_;
};

}  // namespace gpulet::node
